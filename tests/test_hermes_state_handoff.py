"""Cross-platform handoff: the state machine, what unknown ids and closed handles answer, and
a claim that two gateway processes race for."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from pathlib import Path
from subprocess import Popen

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_state import InvalidInputError, SessionDB, StateDbClosedError

NO_HANDOFF = {"state": None, "platform": None, "error": None}


def test_a_handoff_walks_request_claim_complete(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    assert db.get_handoff_state("s1") == NO_HANDOFF
    assert db.request_handoff("s1", "telegram") is True
    assert db.get_handoff_state("s1") == {"state": "pending", "platform": "telegram",
                                          "error": None}
    assert db.claim_handoff("s1") is True
    assert db.claim_handoff("s1") is False  # already running
    assert db.get_handoff_state("s1")["state"] == "running"
    assert db.complete_handoff("s1") is None
    assert db.get_handoff_state("s1") == {"state": "completed", "platform": "telegram",
                                          "error": None}


@pytest.mark.parametrize("state", ["pending", "running"])
def test_a_new_request_waits_for_the_handoff_in_flight(db: SessionDB, state: str) -> None:
    db.create_session("s1", "cli")
    db.request_handoff("s1", "telegram")
    if state == "running":
        db.claim_handoff("s1")
    assert db.request_handoff("s1", "discord") is False
    assert db.get_handoff_state("s1") == {"state": state, "platform": "telegram", "error": None}


@pytest.mark.parametrize("finish", ["complete", "fail"])
def test_a_finished_handoff_can_be_requested_again_and_the_error_is_cleared(
    db: SessionDB, finish: str
) -> None:
    db.create_session("s1", "cli")
    db.request_handoff("s1", "telegram")
    if finish == "complete":
        db.complete_handoff("s1")
    else:
        db.fail_handoff("s1", "gateway offline")
    assert db.request_handoff("s1", "discord") is True
    assert db.get_handoff_state("s1") == {"state": "pending", "platform": "discord",
                                          "error": None}


def test_fail_and_complete_apply_whatever_the_state(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    db.fail_handoff("s1", "never requested")
    assert db.get_handoff_state("s1") == {"state": "failed", "platform": None,
                                          "error": "never requested"}
    db.complete_handoff("s1")
    assert db.get_handoff_state("s1") == {"state": "completed", "platform": None,
                                          "error": None}


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(error=st.text(max_size=1200))
def test_a_failure_keeps_the_first_500_characters_of_its_error(db: SessionDB, error: str) -> None:
    db.create_session("s1", "cli")
    db.fail_handoff("s1", error)
    assert db.get_handoff_state("s1")["error"] == error[:500]


def test_unknown_sessions_change_nothing_and_raise_nothing(db: SessionDB) -> None:
    assert db.request_handoff("ghost", "telegram") is False
    assert db.claim_handoff("ghost") is False
    assert db.complete_handoff("ghost") is None
    assert db.fail_handoff("ghost", "x") is None
    assert db.get_handoff_state("ghost") is None
    assert db.get_session("ghost") is None


@pytest.mark.parametrize("platform", [None, "", "   ", 7])
def test_a_request_must_name_a_platform(db: SessionDB, platform: object) -> None:
    db.create_session("s1", "cli")
    with pytest.raises(InvalidInputError):
        db.request_handoff("s1", platform)
    assert db.get_handoff_state("s1") == NO_HANDOFF


def test_pending_handoffs_are_full_rows_oldest_first(db: SessionDB) -> None:
    for sid, started in (("late", 30.0), ("early", 10.0), ("mid", 20.0), ("idle", 5.0)):
        db.create_session(sid, "tui", started_at=started, cwd="/w")
    for sid in ("late", "early", "mid"):
        db.request_handoff(sid, "slack")
    db.claim_handoff("mid")
    pending = db.list_pending_handoffs()
    assert [r["id"] for r in pending] == ["early", "late"]
    assert pending[0] == db.get_session("early")
    assert pending[0]["handoff_platform"] == "slack" and pending[0]["cwd"] == "/w"


def test_a_closed_handle_answers_the_watchers_reads_and_refuses_writes(db_path: Path) -> None:
    db = SessionDB(db_path)
    db.create_session("s1", "cli")
    db.request_handoff("s1", "telegram")
    db.close()
    assert db.get_handoff_state("s1") is None
    assert db.list_pending_handoffs() == []
    for call in (lambda: db.request_handoff("s1", "x"), lambda: db.claim_handoff("s1"),
                 lambda: db.complete_handoff("s1"), lambda: db.fail_handoff("s1", "e")):
        with pytest.raises(StateDbClosedError):
            call()


# Claims every session id on argv[2:] (one claim each) in the order given, once the clock
# reaches argv[1]; prints the ids it won.
CLAIM_SCRIPT = """
import json, sys, time
from hermes_state import SessionDB
time.sleep(max(0.0, float(sys.argv[2]) - time.time()))
with SessionDB(sys.argv[1]) as db:
    print(json.dumps([sid for sid in sys.argv[3:] if db.claim_handoff(sid)]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_watchers_never_claim_the_same_handoff(
    db_path: Path, seed: int, spawn_python: Callable[..., Popen[str]]
) -> None:
    ids = [f"s{n}" for n in range(40)]
    with SessionDB(db_path) as db:
        for sid in ids:
            db.create_session(sid, "cli")
            db.request_handoff(sid, "telegram")
    start = f"{time.time() + 0.8:.3f}"
    orders = [random.Random(seed * 10 + n).sample(ids, len(ids)) for n in range(2)]
    procs = [spawn_python(CLAIM_SCRIPT, str(db_path), start, *order) for order in orders]
    won = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        won.append(set(json.loads(out)))
    assert won[0].isdisjoint(won[1])
    assert won[0] | won[1] == set(ids)
    with SessionDB(db_path) as db:
        assert db.list_pending_handoffs() == []
        assert {db.get_handoff_state(sid)["state"] for sid in ids} == {"running"}
