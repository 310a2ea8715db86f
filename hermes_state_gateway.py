"""The gateway's runtime ledgers and tables, and who owns an input on its exception path.

Every function runs in the caller's transaction; a refused operation writes nothing. Owner
calls pass the runtime epoch; a stale one raises :class:`StaleEpochError`.

**Admissions** are a durable input FIFO per session, idempotent per request id::

    queued ──claim──▶ started ──settle──▶ settled
      │                  │ a newer epoch begins
      │                  ▼
      │               unknown ──resolve_unknown──▶ resolved
      └──settle(outcome="cancelled")──▶ settled

**Worker executions** bind a managed worker to a session and an epoch::

    registered ──first receipt──▶ running ──finish──▶ finished
    registered / running ──a newer epoch begins──▶ unknown ──resolve──▶ resolved

Work interrupted by a new epoch may have run partly, so it becomes ``unknown`` and is never
replayed; inputs queued behind it wait until it is resolved. Live states pin the session
against deletion. Receipts are numbered without gaps, each with the SHA-256 of
:func:`canonical_json`.

**Gateway tables.** ``delivery_obligations`` is the outbox of owed replies, created by the
first obligation; a store without it owes nothing. ``gateway_routing`` maps session keys to
routes, and ``async_delegations`` tracks delegations until they finish (a table the
application's delegation tool writes too, in the previous store's shape).

**Exception-path ownership.** Each accepted input carries an owner marker
(:func:`ingress_owner_marker`). :func:`persist_exception_input` appends an input only if no row
owns its marker, looking in :func:`owner_search_order`. It never matches by content, and an
unreadable lookup raises rather than append on a guess."""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from hermes_state_arguments import shown
from hermes_state_common import (
    Text,
    clean_optional,
    clean_text,
    decode_json,
    encode_json,
    now,
    row_to_dict,
)
from hermes_state_connect import split_sql, table_exists
from hermes_state_schema_sql import (
    DELIVERY_OBLIGATIONS_SQL,
    LIVE_ADMISSION_STATUSES,
    LIVE_EXECUTION_STATUSES,
    sql_values,
)
from hermes_state_errors import (
    InvalidInputError,
    InvalidTypeError,
    LedgerConflictError,
    OwnerLookupError,
    ReceiptRejectedError,
    StaleEpochError,
    is_corruption_error,
    is_sqlite_lock_error,
)
from hermes_state_lineage import compression_ancestors, compression_tip, forwarding_chain
from hermes_state_messages import insert_message
from hermes_state_replay import gateway_should_persist
from hermes_state_sessions import lift_auto_archive, require_session

__all__ = [
    "OUTCOMES",
    "OWNER_MARKER_KEY",
    "begin_runtime_epoch",
    "get_runtime_epoch",
    "admit_input",
    "claim_next_input",
    "settle_input",
    "resolve_unknown_input",
    "get_admission",
    "list_admissions",
    "canonical_json",
    "receipt_digest",
    "register_worker_execution",
    "record_worker_receipt",
    "finish_worker_execution",
    "resolve_unknown_execution",
    "list_worker_executions",
    "list_worker_receipts",
    "record_delivery_obligation",
    "record_delivery_failure",
    "settle_delivery_obligation",
    "get_delivery_obligation",
    "list_owed_deliveries",
    "save_gateway_routing_entry",
    "load_gateway_routing_entries",
    "replace_gateway_routing_entries",
    "delete_gateway_routing_entries",
    "record_async_delegation",
    "update_async_delegation",
    "get_async_delegation",
    "list_async_delegations",
    "ingress_owner_marker",
    "with_owner_marker",
    "owner_search_order",
    "find_owned_input",
    "persist_exception_input",
]

OUTCOMES = frozenset({"completed", "failed", "cancelled"})
OWNER_MARKER_KEY = "owner_marker"


def _check_text(name: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{name} must be a non-empty string, got {shown(value)}")
    return clean_text(value)


def _payload_json(payload: Any) -> str:
    """JSON text of a payload column (NOT NULL): None is stored as JSON ``null``."""
    return encode_json(payload, "payload") or "null"


def _check_outcome(outcome: Any) -> str:
    if outcome not in OUTCOMES:
        raise InvalidInputError(f"outcome must be one of {sorted(OUTCOMES)}, got {shown(outcome)}")
    return str(outcome)


# ---------------------------------------------------------------------------------------------
# Runtime epoch
# ---------------------------------------------------------------------------------------------

BEGIN_EPOCH_SQL = """
INSERT INTO runtime_epoch (id, epoch, instance_id, started_at) VALUES (1, 1, ?, ?)
ON CONFLICT(id) DO UPDATE SET
    epoch = epoch + 1, instance_id = excluded.instance_id, started_at = excluded.started_at
"""
# What the previous owners had in hand when they stopped: its fate is unknown, never replayed.
ORPHAN_ADMISSIONS_SQL = """
UPDATE session_admissions SET status = 'unknown' WHERE status = 'started' AND epoch < ?
"""
ORPHAN_EXECUTIONS_SQL = """
UPDATE worker_executions SET status = 'unknown'
WHERE status IN ('registered', 'running') AND epoch < ?
"""
SELECT_EPOCH_SQL = "SELECT epoch, instance_id, started_at FROM runtime_epoch WHERE id = 1"


def begin_runtime_epoch(conn: sqlite3.Connection, /, instance_id: str) -> int:
    """Make ``instance_id`` the owner under a new epoch and return it (1 for the first owner).

    Admissions still ``started`` and worker executions still ``registered``/``running`` under
    older epochs become ``unknown``.
    """
    conn.execute(BEGIN_EPOCH_SQL, (_check_text("instance_id", instance_id), now()))
    epoch = int(conn.execute(SELECT_EPOCH_SQL).fetchone()[0])
    conn.execute(ORPHAN_ADMISSIONS_SQL, (epoch,))
    conn.execute(ORPHAN_EXECUTIONS_SQL, (epoch,))
    return epoch


def get_runtime_epoch(conn: sqlite3.Connection, /) -> dict[str, Any] | None:
    """``{"epoch", "instance_id", "started_at"}`` of the current owner; None before the first."""
    row = conn.execute(SELECT_EPOCH_SQL).fetchone()
    return None if row is None else dict(zip(("epoch", "instance_id", "started_at"), row))


def _require_epoch(conn: sqlite3.Connection, /, epoch: int) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int):
        raise InvalidTypeError(f"epoch must be an int, got {type(epoch).__name__}")
    row = conn.execute(SELECT_EPOCH_SQL).fetchone()
    current = 0 if row is None else int(row[0])
    if epoch != current:
        raise StaleEpochError(
            f"epoch {epoch} is not the current runtime epoch ({current})",
            epoch=epoch,
            current_epoch=current,
        )
    return epoch


# ---------------------------------------------------------------------------------------------
# Admissions
# ---------------------------------------------------------------------------------------------

_ADMISSION_COLUMNS = (
    "id", "session_id", "principal_id", "request_id", "intent", "payload_json", "status",
    "epoch", "outcome", "result_json", "created_at", "started_at", "finished_at",
)
SELECT_ADMISSION_SQL = f"SELECT {', '.join(_ADMISSION_COLUMNS)} FROM session_admissions"
INSERT_ADMISSION_SQL = """
INSERT INTO session_admissions
    (session_id, principal_id, request_id, intent, payload_json, created_at)
VALUES (?, ?, ?, ?, ?, ?)
ON CONFLICT (principal_id, session_id, request_id) DO NOTHING
"""
# The oldest live admission of a session: the head of its FIFO.
HEAD_ADMISSION_SQL = (
    SELECT_ADMISSION_SQL
    + f" WHERE session_id = ? AND status IN {sql_values(LIVE_ADMISSION_STATUSES)}"
    + " ORDER BY id LIMIT 1"
)
CLAIM_ADMISSION_SQL = """
UPDATE session_admissions SET status = 'started', epoch = ?, started_at = ?
WHERE id = ? AND status = 'queued'
"""
FINISH_ADMISSION_SQL = """
UPDATE session_admissions
SET status = ?, epoch = ?, outcome = ?, result_json = ?, finished_at = ?
WHERE id = ?
"""


def _admission(row: tuple[Any, ...] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    admission = dict(zip(_ADMISSION_COLUMNS, row, strict=True))
    admission["principal_id"] = admission["principal_id"] or None
    admission["payload"] = decode_json(admission.pop("payload_json"))
    admission["result"] = decode_json(admission.pop("result_json"))
    return admission


def get_admission(conn: sqlite3.Connection, /, admission_id: int) -> dict[str, Any] | None:
    row = conn.execute(SELECT_ADMISSION_SQL + " WHERE id = ?", (admission_id,)).fetchone()
    return _admission(row)


def _existing_admission(conn: sqlite3.Connection, /, admission_id: int) -> dict[str, Any]:
    admission = get_admission(conn, admission_id)
    if admission is None:
        raise LedgerConflictError(f"no admission {admission_id}")
    return admission


def admit_input(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    payload: Any,
    *,
    request_id: str | None = None,
    principal_id: str | None = None,
    intent: str = "queue",
) -> dict[str, Any]:
    """Queue an input for the session; the admission row with ``duplicate`` (True when this
    request was admitted before: that first admission is returned unchanged)."""
    require_session(conn, session_id)
    principal = "" if principal_id is None else clean_text(str(principal_id))
    request = None if request_id is None else _check_text("request_id", request_id)
    cursor = conn.execute(
        INSERT_ADMISSION_SQL,
        (session_id, principal, request, _check_text("intent", intent), _payload_json(payload),
         now()),
    )
    if cursor.rowcount:
        admission = get_admission(conn, int(cursor.lastrowid or 0))
    else:
        admission = _admission(conn.execute(
            SELECT_ADMISSION_SQL + " WHERE principal_id = ? AND session_id = ? AND request_id = ?",
            (principal, session_id, request),
        ).fetchone())
    assert admission is not None
    admission["duplicate"] = not cursor.rowcount
    return admission


def claim_next_input(
    conn: sqlite3.Connection, /, session_id: str, *, epoch: int
) -> dict[str, Any] | None:
    """Start the session's oldest queued admission under ``epoch`` and return it; None when
    nothing is queued, or while an earlier admission is ``started`` or ``unknown``."""
    _require_epoch(conn, epoch)
    head = _admission(conn.execute(HEAD_ADMISSION_SQL, (session_id,)).fetchone())
    if head is None or head["status"] != "queued":
        return None
    conn.execute(CLAIM_ADMISSION_SQL, (epoch, now(), head["id"]))
    return get_admission(conn, head["id"])


def settle_input(
    conn: sqlite3.Connection,
    /,
    admission_id: int,
    *,
    epoch: int,
    outcome: str,
    result: Any = None,
) -> dict[str, Any]:
    """Finish an admission this owner started (``settled``), or cancel one still queued
    (``outcome="cancelled"`` only). Anything else raises :class:`LedgerConflictError`."""
    _require_epoch(conn, epoch)
    _check_outcome(outcome)
    admission = _existing_admission(conn, admission_id)
    status = admission["status"]
    started_here = status == "started" and admission["epoch"] == epoch
    if not (started_here or (status == "queued" and outcome == "cancelled")):
        raise LedgerConflictError(
            f"admission {admission_id} is {status} (epoch {admission['epoch']});"
            f" epoch {epoch} cannot settle it as {outcome}"
        )
    conn.execute(
        FINISH_ADMISSION_SQL,
        ("settled", epoch, outcome, encode_json(result, "result"), now(), admission_id),
    )
    return _existing_admission(conn, admission_id)


def resolve_unknown_input(
    conn: sqlite3.Connection, /, admission_id: int, *, epoch: int, outcome: str
) -> dict[str, Any]:
    """Decide what happened to an ``unknown`` admission (``prompt.resolve_unknown``): it becomes
    ``resolved`` with ``outcome`` and is never run again; the admissions behind it proceed.
    Its ``epoch`` stays the one it started under."""
    _require_epoch(conn, epoch)
    _check_outcome(outcome)
    admission = _existing_admission(conn, admission_id)
    if admission["status"] != "unknown":
        raise LedgerConflictError(f"admission {admission_id} is {admission['status']}, not unknown")
    conn.execute(
        FINISH_ADMISSION_SQL,
        ("resolved", admission["epoch"], outcome, None, now(), admission_id),
    )
    return _existing_admission(conn, admission_id)


def list_admissions(
    conn: sqlite3.Connection, /, session_id: str, pending_only: bool = True
) -> list[dict[str, Any]]:
    """The session's admissions in FIFO order; only the live ones unless asked."""
    sql = SELECT_ADMISSION_SQL + " WHERE session_id = ?"
    if pending_only:
        sql += f" AND status IN {sql_values(LIVE_ADMISSION_STATUSES)}"
    rows = conn.execute(sql + " ORDER BY id", (session_id,)).fetchall()
    return [a for a in map(_admission, rows) if a is not None]


# ---------------------------------------------------------------------------------------------
# Worker executions and receipts
# ---------------------------------------------------------------------------------------------


def canonical_json(payload: Any) -> str:
    """The canonical JSON text of a receipt payload: ``json.dumps`` with sorted keys, no
    whitespace, non-ASCII as itself and no NaN (not RFC 8785). ``payload_json`` stores exactly
    this text, so a stored receipt can be verified again. A payload JSON cannot carry, or with
    a lone surrogate, is refused."""
    try:
        text = json.dumps(
            payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
    except TypeError as exc:
        raise InvalidTypeError(f"payload is not JSON: {exc}", argument="payload") from exc
    except (ValueError, RecursionError) as exc:
        raise InvalidInputError(f"payload is not JSON: {exc!r}", argument="payload") from exc
    if clean_text(text) != text:
        raise InvalidInputError("payload holds a lone surrogate: it has no UTF-8 bytes to digest",
                                argument="payload")
    return text


def receipt_digest(payload: Any) -> str:
    """SHA-256 hex of the payload's canonical JSON, UTF-8 encoded."""
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


_EXECUTION_COLUMNS = (
    "execution_id", "session_id", "epoch", "kind", "status", "outcome", "last_sequence",
    "registered_at", "finished_at",
)
SELECT_EXECUTION_SQL = f"SELECT {', '.join(_EXECUTION_COLUMNS)} FROM worker_executions"
INSERT_EXECUTION_SQL = """
INSERT INTO worker_executions (execution_id, session_id, epoch, kind, registered_at)
VALUES (?, ?, ?, ?, ?)
"""
INSERT_RECEIPT_SQL = """
INSERT INTO worker_receipts (execution_id, session_id, sequence, payload_json, digest,
                             recorded_at)
VALUES (?, ?, ?, ?, ?, ?)
"""
ADVANCE_EXECUTION_SQL = """
UPDATE worker_executions SET last_sequence = ?, status = 'running' WHERE execution_id = ?
"""
FINISH_EXECUTION_SQL = """
UPDATE worker_executions SET status = ?, outcome = ?, finished_at = ? WHERE execution_id = ?
"""
SELECT_RECEIPTS_SQL = """
SELECT execution_id, session_id, sequence, payload_json, digest, recorded_at
FROM worker_receipts WHERE execution_id = ? ORDER BY sequence
"""


def _execution(conn: sqlite3.Connection, /, execution_id: str) -> dict[str, Any] | None:
    row = conn.execute(SELECT_EXECUTION_SQL + " WHERE execution_id = ?", (execution_id,))
    found = row.fetchone()
    return None if found is None else dict(zip(_EXECUTION_COLUMNS, found, strict=True))


def _existing_execution(conn: sqlite3.Connection, /, execution_id: str) -> dict[str, Any]:
    execution = _execution(conn, execution_id)
    if execution is None:
        raise LedgerConflictError(f"no worker execution {execution_id!r}")
    return execution


def register_worker_execution(
    conn: sqlite3.Connection, /, execution_id: str, session_id: str, *, epoch: int, kind: str
) -> dict[str, Any]:
    """Bind a managed worker to a session under the owner's ``epoch`` (status
    ``registered``). An execution id is registered once; again raises
    :class:`LedgerConflictError`."""
    _require_epoch(conn, epoch)
    _check_text("execution_id", execution_id)
    require_session(conn, session_id)
    if _execution(conn, execution_id) is not None:
        raise LedgerConflictError(f"worker execution {execution_id!r} is already registered")
    conn.execute(
        INSERT_EXECUTION_SQL, (execution_id, session_id, epoch, _check_text("kind", kind), now())
    )
    return _existing_execution(conn, execution_id)


def record_worker_receipt(
    conn: sqlite3.Connection, /, execution_id: str, sequence: int, payload: Any, *, digest: str
) -> dict[str, Any]:
    """Record the next result of a live execution. ``sequence`` must be exactly the next
    number and ``digest`` the SHA-256 hex (either case) of :func:`canonical_json`; a gap, a
    repeat, a wrong digest or an execution that is not live raises
    :class:`ReceiptRejectedError` (``reason`` says which) and writes nothing.

    Returns the receipt: ``execution_id, session_id, sequence, payload, digest, recorded_at``.
    """
    if isinstance(sequence, bool) or not isinstance(sequence, int):
        raise InvalidTypeError(f"sequence must be an int, got {type(sequence).__name__}")
    execution = _execution(conn, execution_id)

    def refuse(reason: str, message: str, expected: int | None = None) -> ReceiptRejectedError:
        return ReceiptRejectedError(
            f"receipt {sequence} of {execution_id!r} refused: {message}",
            reason=reason, execution_id=execution_id, sequence=sequence,
            expected_sequence=expected,
        )

    if execution is None:
        raise refuse("unknown_execution", "no such execution")
    if execution["status"] not in ("registered", "running"):
        raise refuse("not_live", f"the execution is {execution['status']}")
    expected = int(execution["last_sequence"]) + 1
    if sequence > expected:
        raise refuse("gap", f"expected {expected}", expected)
    if sequence < expected:
        raise refuse("out_of_order", f"already have up to {expected - 1}", expected)
    text = canonical_json(payload)
    actual = hashlib.sha256(text.encode("utf-8")).hexdigest()
    if not isinstance(digest, str) or digest.lower() != actual:
        raise refuse("digest_mismatch", "the digest does not match the payload", expected)
    stamp = now()
    conn.execute(
        INSERT_RECEIPT_SQL,
        (execution_id, execution["session_id"], sequence, text, actual, stamp),
    )
    conn.execute(ADVANCE_EXECUTION_SQL, (sequence, execution_id))
    return {
        "execution_id": execution_id, "session_id": execution["session_id"],
        "sequence": sequence, "payload": json.loads(text), "digest": actual,
        "recorded_at": stamp,
    }


def finish_worker_execution(
    conn: sqlite3.Connection, /, execution_id: str, *, epoch: int, outcome: str
) -> dict[str, Any]:
    """Finish a live execution of this owner's epoch (``finished``). One that became
    ``unknown`` needs :func:`resolve_unknown_execution` instead."""
    _require_epoch(conn, epoch)
    _check_outcome(outcome)
    execution = _existing_execution(conn, execution_id)
    if execution["status"] not in ("registered", "running") or execution["epoch"] != epoch:
        raise LedgerConflictError(
            f"worker execution {execution_id!r} is {execution['status']} under epoch"
            f" {execution['epoch']}; epoch {epoch} cannot finish it"
        )
    conn.execute(FINISH_EXECUTION_SQL, ("finished", outcome, now(), execution_id))
    return _existing_execution(conn, execution_id)


def resolve_unknown_execution(
    conn: sqlite3.Connection, /, execution_id: str, *, epoch: int, outcome: str
) -> dict[str, Any]:
    """Decide what happened to an ``unknown`` execution: it becomes ``resolved``."""
    _require_epoch(conn, epoch)
    _check_outcome(outcome)
    execution = _existing_execution(conn, execution_id)
    if execution["status"] != "unknown":
        raise LedgerConflictError(
            f"worker execution {execution_id!r} is {execution['status']}, not unknown"
        )
    conn.execute(FINISH_EXECUTION_SQL, ("resolved", outcome, now(), execution_id))
    return _existing_execution(conn, execution_id)


def list_worker_executions(
    conn: sqlite3.Connection, /, session_id: str, live_only: bool = True
) -> list[dict[str, Any]]:
    """The session's worker executions, oldest first; only the live ones unless asked."""
    sql = SELECT_EXECUTION_SQL + " WHERE session_id = ?"
    if live_only:
        sql += f" AND status IN {sql_values(LIVE_EXECUTION_STATUSES)}"
    rows = conn.execute(sql + " ORDER BY registered_at, execution_id", (session_id,))
    return [dict(zip(_EXECUTION_COLUMNS, r, strict=True)) for r in rows.fetchall()]


def list_worker_receipts(conn: sqlite3.Connection, /, execution_id: str) -> list[dict[str, Any]]:
    """An execution's receipts in sequence order, payloads decoded."""
    out = []
    for execution, session_id, sequence, payload, digest, recorded_at in conn.execute(
        SELECT_RECEIPTS_SQL, (execution_id,)
    ):
        out.append({
            "execution_id": execution, "session_id": session_id, "sequence": sequence,
            "payload": json.loads(payload), "digest": digest, "recorded_at": recorded_at,
        })
    return out


# ---------------------------------------------------------------------------------------------
# Delivery obligations (the outbox of owed replies; the table is created on first use)
# ---------------------------------------------------------------------------------------------

DELIVERY_OUTCOMES = frozenset({"delivered", "abandoned"})
INSERT_OBLIGATION_SQL = """
INSERT INTO delivery_obligations (session_id, platform, chat_id, thread_id, obligation_key,
                                  payload_json, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (obligation_key) DO NOTHING
"""
OBLIGATION_FAILED_SQL = """
UPDATE delivery_obligations SET attempts = attempts + 1, last_error = ?, updated_at = ?
WHERE obligation_key = ? AND status = 'owed'
"""
SETTLE_OBLIGATION_SQL = """
UPDATE delivery_obligations SET status = ?, updated_at = ?, settled_at = ?
WHERE obligation_key = ? AND status = 'owed'
"""


def _obligation(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    obligation = row_to_dict(cursor, row)
    obligation["payload"] = decode_json(obligation.pop("payload_json"))
    return obligation


def get_delivery_obligation(
    conn: sqlite3.Connection, /, obligation_key: str
) -> dict[str, Any] | None:
    if not table_exists(conn, "delivery_obligations"):
        return None
    cursor = conn.execute(
        "SELECT * FROM delivery_obligations WHERE obligation_key = ?", (obligation_key,)
    )
    row = cursor.fetchone()
    return None if row is None else _obligation(cursor, row)


def _existing_obligation(conn: sqlite3.Connection, /, obligation_key: str) -> dict[str, Any]:
    obligation = get_delivery_obligation(conn, obligation_key)
    if obligation is None:
        raise LedgerConflictError(f"no delivery obligation {obligation_key!r}")
    return obligation


def _chat_part(name: str, value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or value == "":
        raise InvalidInputError(
            f"{name} must be a non-empty string or an int, got {shown(value)}")
    return clean_text(str(value))


def record_delivery_obligation(
    conn: sqlite3.Connection,
    /,
    obligation_key: str,
    *,
    platform: str,
    chat_id: str | int,
    payload: Any,
    session_id: str | None = None,
    thread_id: str | int | None = None,
) -> dict[str, Any]:
    """Record a reply owed to a chat (``owed``), creating the outbox on first use. The key is
    the caller's idempotency key: recording it again returns the first obligation with
    ``duplicate=True``."""
    _check_text("obligation_key", obligation_key)
    if not table_exists(conn, "delivery_obligations"):
        for statement in split_sql(DELIVERY_OBLIGATIONS_SQL):
            conn.execute(statement)
    stamp = now()
    thread = None if thread_id is None else _chat_part("thread_id", thread_id)
    cursor = conn.execute(
        INSERT_OBLIGATION_SQL,
        (clean_optional(session_id), _check_text("platform", platform),
         _chat_part("chat_id", chat_id), thread, obligation_key, _payload_json(payload),
         stamp, stamp),
    )
    obligation = _existing_obligation(conn, obligation_key)
    obligation["duplicate"] = not cursor.rowcount
    return obligation


def record_delivery_failure(
    conn: sqlite3.Connection, /, obligation_key: str, error: Text
) -> dict[str, Any]:
    """Count a failed delivery attempt; the obligation stays ``owed``."""
    if not conn.execute(
        OBLIGATION_FAILED_SQL, (clean_text(str(error)), now(), obligation_key)
    ).rowcount:
        raise LedgerConflictError(f"no owed delivery obligation {obligation_key!r}")
    return _existing_obligation(conn, obligation_key)


def settle_delivery_obligation(
    conn: sqlite3.Connection, /, obligation_key: str, *, outcome: str = "delivered"
) -> dict[str, Any]:
    """Settle an owed obligation as ``delivered`` or ``abandoned``; settling one that is not
    owed (unknown or already settled) raises :class:`LedgerConflictError`."""
    if outcome not in DELIVERY_OUTCOMES:
        raise InvalidInputError(
            f"outcome must be one of {sorted(DELIVERY_OUTCOMES)}, got {outcome!r}")
    current = _existing_obligation(conn, obligation_key)
    stamp = now()
    if not conn.execute(SETTLE_OBLIGATION_SQL, (outcome, stamp, stamp, obligation_key)).rowcount:
        raise LedgerConflictError(
            f"delivery obligation {obligation_key!r} is already {current['status']}"
        )
    return _existing_obligation(conn, obligation_key)


def list_owed_deliveries(
    conn: sqlite3.Connection,
    /,
    *,
    platform: str | None = None,
    session_id: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """Owed obligations, oldest first (empty while the outbox was never used)."""
    if not table_exists(conn, "delivery_obligations"):
        return []
    sql = "SELECT * FROM delivery_obligations WHERE status = 'owed'"
    params: list[Any] = []
    if platform is not None:
        sql += " AND platform = ?"
        params.append(platform)
    if session_id is not None:
        sql += " AND session_id = ?"
        params.append(session_id)
    cursor = conn.execute(sql + " ORDER BY created_at, id LIMIT ?",
                          (*params, -1 if limit is None else limit))
    return [_obligation(cursor, r) for r in cursor.fetchall()]


# ---------------------------------------------------------------------------------------------
# Gateway routing
# ---------------------------------------------------------------------------------------------

UPSERT_ROUTING_SQL = """
INSERT INTO gateway_routing (scope, session_key, entry_json, updated_at) VALUES (?, ?, ?, ?)
ON CONFLICT (scope, session_key) DO UPDATE SET
    entry_json = excluded.entry_json, updated_at = excluded.updated_at
"""
# The keys travel as one JSON parameter: any number of them, no bound-parameter limit.
DELETE_ROUTING_SQL = """
DELETE FROM gateway_routing
WHERE scope = ? AND session_key IN (SELECT value FROM json_each(?))
"""


def _routing_json(entry_json: Any) -> str:
    """JSON text for an entry: a string is taken as JSON text (and must parse), anything else
    is encoded."""
    if isinstance(entry_json, str):
        try:
            json.loads(entry_json)
        except ValueError as exc:
            raise InvalidInputError(f"a routing entry is not JSON text: {exc}",
                                    argument="entry_json") from exc
        return clean_text(entry_json)
    text = encode_json(entry_json, "entry_json")
    if text is None:
        raise InvalidInputError("a routing entry cannot be None")
    return text


def save_gateway_routing_entry(
    conn: sqlite3.Connection, /, session_key: str, entry_json: Any, *, scope: str = ""
) -> None:
    """Insert or replace one routing entry (JSON text or a JSON value) within ``scope``."""
    conn.execute(
        UPSERT_ROUTING_SQL,
        (scope, _check_text("session_key", session_key), _routing_json(entry_json), now()),
    )


def load_gateway_routing_entries(
    conn: sqlite3.Connection, /, *, scope: str = ""
) -> dict[str, str]:
    """``{session_key: entry_json}`` of one scope: each entry's JSON text as stored (the
    gateway parses it)."""
    rows = conn.execute(
        "SELECT session_key, entry_json FROM gateway_routing WHERE scope = ? ORDER BY session_key",
        (scope,),
    )
    return dict(rows.fetchall())


def replace_gateway_routing_entries(
    conn: sqlite3.Connection, /, entries: Mapping[str, Any], *, scope: str = ""
) -> None:
    """Make ``entries`` the whole content of ``scope`` (other scopes untouched)."""
    if not isinstance(entries, Mapping):
        raise InvalidTypeError(
            f"entries must be a mapping of session keys, got {type(entries).__name__}")
    conn.execute("DELETE FROM gateway_routing WHERE scope = ?", (scope,))
    stamp = now()
    conn.executemany(
        UPSERT_ROUTING_SQL,
        [(scope, _check_text("session_key", k), _routing_json(v), stamp)
         for k, v in entries.items()],
    )


def delete_gateway_routing_entries(
    conn: sqlite3.Connection, /, session_keys: Iterable[str], *, scope: str = ""
) -> int:
    """Delete the entries of ``session_keys`` (any number) within ``scope``; returns how many
    existed."""
    if session_keys is None or isinstance(session_keys, str):
        raise InvalidTypeError("session_keys must be a collection of keys, not "
                               f"{'one string' if session_keys else 'None'}")
    keys = [str(k) for k in session_keys]
    if not keys:
        return 0
    return conn.execute(DELETE_ROUTING_SQL, (scope, json.dumps(keys))).rowcount


# ---------------------------------------------------------------------------------------------
# Async delegations
# ---------------------------------------------------------------------------------------------

# The table has the previous store's shape, which the application's delegation tool writes
# too (see hermes_state_schema_sql). These functions map onto it: the parent is both
# ``origin_session`` and ``parent_session_id``, the status is ``state``, the creation time
# ``dispatched_at``, the task a JSON object ``{"goal": <task text>}`` in ``task_json`` (the
# object the tool writes and reads back), the child session this library's extra column.
DELEGATION_STATUSES = ("pending", "running", "completed", "failed", "cancelled")
# Not final: this library's two live statuses and the tool's ``finalizing`` (its result is
# being written). Every other state, the tool's ``error`` and ``unknown`` among them, is final.
DELEGATION_LIVE = ("pending", "running", "finalizing")
DELEGATION_FINAL = frozenset({"completed", "failed", "cancelled"})
INSERT_DELEGATION_SQL = """
INSERT INTO async_delegations (delegation_id, origin_session, parent_session_id, state,
                               dispatched_at, updated_at, task_json, child_session_id, owner_pid)
VALUES (?, ?, ?, 'pending', ?, ?, ?, ?, ?)
ON CONFLICT (delegation_id) DO NOTHING
"""
UPDATE_DELEGATION_SQL = """
UPDATE async_delegations SET state = COALESCE(:status, state),
    completed_at = CASE WHEN :final THEN :now ELSE completed_at END,
    child_session_id = COALESCE(:child, child_session_id),
    result_json = COALESCE(:result, result_json), updated_at = :now
WHERE delegation_id = :id
"""
LIST_DELEGATIONS_SQL = f"""
SELECT * FROM async_delegations
WHERE (:parent IS NULL OR COALESCE(parent_session_id, origin_session) = :parent)
  AND (NOT :live OR state IN {sql_values(DELEGATION_LIVE)})
ORDER BY dispatched_at, delegation_id
"""


def _task_text(detail: Any) -> str | None:
    """The task's text: the ``goal`` of the task object, or the stored value when it is text."""
    if isinstance(detail, dict):
        goal = detail.get("goal")
        return goal if isinstance(goal, str) else None
    return detail if isinstance(detail, str) else None


def _delegation(cursor: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    """A row as the delegation functions return it: every stored column under its own name,
    except ``state`` → ``status``, ``dispatched_at`` → ``created_at``, and the JSON columns
    decoded: ``result_json`` → ``result``, ``event_json`` → ``event``, ``task_json`` →
    ``task_detail`` (the whole object) and ``task`` (its goal text). Text that is not JSON is
    returned as stored, so any row the tool wrote reads."""
    delegation = row_to_dict(cursor, row)
    delegation["status"] = delegation.pop("state", None)
    delegation["created_at"] = delegation.pop("dispatched_at", None)
    delegation["result"] = decode_json(delegation.pop("result_json", None))
    delegation["event"] = decode_json(delegation.pop("event_json", None))
    detail = decode_json(delegation.pop("task_json", None))
    delegation["task_detail"] = detail
    delegation["task"] = _task_text(detail)
    return delegation


def _parent_of(delegation: Mapping[str, Any]) -> Any:
    return delegation["parent_session_id"] or delegation["origin_session"]


def get_async_delegation(conn: sqlite3.Connection, /, delegation_id: str) -> dict[str, Any] | None:
    cursor = conn.execute(
        "SELECT * FROM async_delegations WHERE delegation_id = ?", (delegation_id,)
    )
    row = cursor.fetchone()
    return None if row is None else _delegation(cursor, row)


def record_async_delegation(
    conn: sqlite3.Connection,
    /,
    delegation_id: str,
    parent_session_id: str,
    *,
    task: Text | None = None,
    child_session_id: str | None = None,
) -> dict[str, Any]:
    """Record a delegation (``pending``, owned by this process: ``owner_pid`` is what the
    tool's recovery checks); recording the same id again for the same parent returns the
    first record with ``duplicate=True``, for another parent it raises
    :class:`LedgerConflictError`. A row's parent is its ``parent_session_id``, or its
    ``origin_session`` when the tool left that NULL."""
    stamp = now()
    parent = _check_text("parent_session_id", parent_session_id)
    task_json = None if task is None else encode_json({"goal": clean_text(task)}, "task")
    cursor = conn.execute(
        INSERT_DELEGATION_SQL,
        (_check_text("delegation_id", delegation_id), parent, parent, stamp, stamp, task_json,
         clean_optional(child_session_id), os.getpid()),
    )
    delegation = get_async_delegation(conn, delegation_id)
    assert delegation is not None
    if _parent_of(delegation) != parent_session_id:
        raise LedgerConflictError(
            f"delegation {delegation_id!r} belongs to {_parent_of(delegation)}"
        )
    delegation["duplicate"] = not cursor.rowcount
    return delegation


def update_async_delegation(
    conn: sqlite3.Connection,
    /,
    delegation_id: str,
    *,
    status: str | None = None,
    child_session_id: str | None = None,
    result: Any = None,
) -> dict[str, Any]:
    """Move a delegation forward (``pending`` → ``running`` → a final status; the tool's
    ``finalizing`` sits before the final ones) and/or set its child session and result; a
    final status sets ``completed_at``. A final delegation (any state but the live ones), an
    unknown id or a step backwards raises :class:`LedgerConflictError`."""
    current = get_async_delegation(conn, delegation_id)
    if current is None:
        raise LedgerConflictError(f"no delegation {delegation_id!r}")
    if current["status"] not in DELEGATION_LIVE:
        raise LedgerConflictError(f"delegation {delegation_id!r} is already {current['status']}")
    if status is not None:
        if status not in DELEGATION_STATUSES:
            raise InvalidInputError(f"status must be one of {DELEGATION_STATUSES}, got {status!r}")
        rank = DELEGATION_LIVE.index(current["status"])
        if status not in DELEGATION_FINAL and DELEGATION_LIVE.index(status) < rank:
            raise LedgerConflictError(
                f"delegation {delegation_id!r} cannot go from {current['status']} to {status}"
            )
    conn.execute(
        UPDATE_DELEGATION_SQL,
        {"status": status, "final": status in DELEGATION_FINAL, "now": now(),
         "child": clean_optional(child_session_id), "result": encode_json(result, "result"),
         "id": delegation_id},
    )
    updated = get_async_delegation(conn, delegation_id)
    assert updated is not None
    return updated


def list_async_delegations(
    conn: sqlite3.Connection, /, parent_session_id: str | None = None, *, pending_only: bool = False
) -> list[dict[str, Any]]:
    """Delegations oldest first, of one parent session (see :func:`record_async_delegation`)
    or all; ``pending_only`` keeps those
    not final yet (``pending``, ``running`` and the tool's ``finalizing``)."""
    cursor = conn.execute(
        LIST_DELEGATIONS_SQL, {"parent": parent_session_id, "live": bool(pending_only)})
    return [_delegation(cursor, r) for r in cursor.fetchall()]


# ---------------------------------------------------------------------------------------------
# Exception-path ownership
# ---------------------------------------------------------------------------------------------

_MARKER_PARTS = ("platform", "profile", "scope", "chat_id", "thread_id", "platform_message_id")


def _marker_part(name: str, value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidTypeError(
            f"{name} must be a string, an int or None, got {type(value).__name__}")
    return clean_text(str(value))


def ingress_owner_marker(
    platform: str,
    profile: str | None,
    scope: str | None,
    chat_id: str | int | None,
    thread_id: str | int | None,
    platform_message_id: str | int | None,
) -> str:
    """The owner marker of an accepted input, carried in ``display_metadata["owner_marker"]``.

    With a platform message id it is ``ingress:v1:msg:<sha256 hex>`` over platform, profile,
    scope, chat, thread and message id, so a redelivered event maps to the same marker;
    without one, ``ingress:v1:turn:<uuid4 hex>``, fresh for every turn. In the digest None and
    ``""`` count as the same empty part, an int as its decimal string.
    """
    _check_text("platform", platform)
    if platform_message_id is None or platform_message_id == "":
        return f"ingress:v1:turn:{uuid.uuid4().hex}"
    parts = [
        _marker_part(name, value)
        for name, value in zip(
            _MARKER_PARTS,
            (platform, profile, scope, chat_id, thread_id, platform_message_id),
            strict=True,
        )
    ]
    # A JSON array keeps the parts apart: no separator inside a part can shift a boundary.
    text = json.dumps(["hermes-ingress", *parts], ensure_ascii=False, separators=(",", ":"))
    return f"ingress:v1:msg:{hashlib.sha256(text.encode('utf-8')).hexdigest()}"


def with_owner_marker(display_metadata: Mapping[str, Any] | None, marker: str) -> dict[str, Any]:
    """A copy of ``display_metadata`` carrying ``marker``: what the gateway hands the agent's
    normal persistence with an accepted input."""
    _check_text("marker", marker)
    if display_metadata is None:
        display_metadata = {}
    if not isinstance(display_metadata, Mapping):
        raise InvalidTypeError("display_metadata must be a mapping to carry an owner marker")
    present = display_metadata.get(OWNER_MARKER_KEY)
    if present is not None and present != marker:
        raise InvalidInputError(f"display_metadata already carries owner marker {present!r}")
    return {**display_metadata, OWNER_MARKER_KEY: marker}


# The marker only: bodies are never read or compared; rows whose metadata is not JSON are
# simply not owners. Revoked rows and observed inputs do not own anything.
OWNED_INPUT_SQL = """
SELECT id, session_id, role, message_uid, timestamp, active, observed, effect_disposition,
       platform_message_id, display_metadata
FROM messages
WHERE session_id = ? AND display_metadata IS NOT NULL
  AND CASE WHEN json_valid(display_metadata) THEN json_extract(display_metadata, ?) END = ?
  AND COALESCE(observed, 0) = 0
  AND (effect_disposition IS NULL OR effect_disposition <> 'revoked')
ORDER BY active DESC, id
LIMIT 1
"""
_MARKER_PATH = f"$.{OWNER_MARKER_KEY}"
_OWNED_COLUMNS = (
    "id", "session_id", "role", "message_uid", "timestamp", "active", "observed",
    "effect_disposition", "platform_message_id", "display_metadata",
)


def owner_search_order(conn: sqlite3.Connection, /, session_id: str) -> list[str]:
    """Where an input accepted for ``session_id`` may be stored, in search order; the first
    entry is where the exception path appends (the live session). Empty for an unknown
    session.

    1. the published forwarding target (the end of the ``successor_session_id`` chain);
    2. the canonical current compression successor (the compression tip);
    3. the compression ancestors: the forwarding chain back towards the session, then the
       compression ancestors of the target, of the tip and of the session itself.
    """
    forwarded = forwarding_chain(conn, session_id)
    tip = compression_tip(conn, session_id)
    order: list[str] = []

    def add(candidates: Iterable[str | None]) -> None:
        order.extend(c for c in candidates if c is not None and c not in order)

    add(forwarded[-1:])
    add([tip])
    add(reversed(forwarded))
    for start in (*forwarded[-1:], tip, session_id):
        if start is not None:
            add(compression_ancestors(conn, start))
    return order


def _find_owned(
    conn: sqlite3.Connection, /, order: Iterable[str], marker: str
) -> dict[str, Any] | None:
    for session_id in order:
        row = conn.execute(OWNED_INPUT_SQL, (session_id, _MARKER_PATH, marker)).fetchone()
        if row is not None:
            owned = dict(zip(_OWNED_COLUMNS, row, strict=True))
            owned["active"], owned["observed"] = bool(owned["active"]), bool(owned["observed"])
            owned["display_metadata"] = decode_json(owned["display_metadata"])
            return owned
    return None


def find_owned_input(
    conn: sqlite3.Connection, /, session_id: str, marker: str
) -> dict[str, Any] | None:
    """The row that owns ``marker`` for ``session_id`` (searched as :func:`owner_search_order`
    lists), or None. The row comes without its bodies: ``id, session_id, role, message_uid,
    timestamp, active, observed, effect_disposition, platform_message_id,
    display_metadata``."""
    return _find_owned(conn, owner_search_order(conn, session_id), _check_text("marker", marker))


def persist_exception_input(
    conn: sqlite3.Connection,
    /,
    session_id: str,
    content: Text | list[Any] | dict[str, Any] | None,
    *,
    marker: str,
    role: Text = "user",
    agent_owns_persistence: bool = False,
    **fields: Any,
) -> tuple[str, int | None]:
    """Write an accepted input on the gateway's exception path, unless a row already owns it.

    Returns ``("existing", row_id)`` when the marker is found (nothing written),
    ``("appended", row_id)`` after appending it, with the marker in ``display_metadata``, to
    the live session of :func:`owner_search_order`, or ``("agent_owned", None)`` when the
    agent owns persistence (nothing read or written). ``fields`` are further
    ``append_message`` fields.

    Raises :class:`OwnerLookupError`, appending nothing, when the owner lookup cannot be read.
    Two read failures are the write wrapper's instead: a lock error (it retries lookup and
    append together) and file corruption (it quarantines the handle and raises
    :class:`StateDbCorruptError`; the call's arguments are spooled to
    ``<home>/sessions/<id>.jsonl`` to be replayed through this function, never appended).
    """
    if not gateway_should_persist(agent_owns_persistence):
        return ("agent_owned", None)
    _check_text("marker", marker)
    try:
        order = owner_search_order(conn, session_id)
        owned = _find_owned(conn, order, marker)
    except sqlite3.Error as exc:
        if is_sqlite_lock_error(exc) or is_corruption_error(exc):
            raise  # the write wrapper retries, or quarantines the handle
        raise OwnerLookupError(
            f"could not read the owner of input {marker} for session {session_id}: {exc}"
        ) from exc
    if owned is not None:
        return ("existing", int(owned["id"]))
    fields["display_metadata"] = with_owner_marker(fields.get("display_metadata"), marker)
    target = order[0] if order else session_id
    row_id = insert_message(conn, target, {**fields, "role": role, "content": content})
    if role == "user" and not fields.get("observed"):
        lift_auto_archive(conn, target, check=True)
    return ("appended", row_id)

