"""The compressor's memory between turns: the fallback streak and the failure cooldown, and the
lenient answers its probes rely on (a closed handle, a locked store)."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_state import InvalidInputError, SessionDB, StateDbClosedError, Timing


def test_a_new_session_has_no_streak_and_no_cooldown(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    row = db.get_session("s1")
    assert (row["compression_fallback_streak"], row["compression_failure_cooldown_until"],
            row["compression_failure_error"]) == (0, None, None)
    assert db.get_compression_fallback_streak("s1") == 0
    assert db.get_compression_failure_cooldown("s1") is None


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(streak=st.one_of(st.integers(-10**30, 10**30), st.floats(-1e6, 1e6),
                        st.integers(0, 99).map(str), st.booleans()))
def test_the_streak_is_stored_as_a_non_negative_integer(db: SessionDB, streak: object) -> None:
    db.create_session("s1", "cli")
    db.set_compression_fallback_streak("s1", streak)
    expected = min(max(0, int(streak)), 2**63 - 1)
    assert db.get_compression_fallback_streak("s1") == expected
    assert db.get_session("s1")["compression_fallback_streak"] == expected


@pytest.mark.parametrize("streak", [None, "many", float("nan"), float("inf"), [1]])
def test_a_streak_that_is_not_a_number_is_refused(db: SessionDB, streak: object) -> None:
    db.create_session("s1", "cli")
    db.set_compression_fallback_streak("s1", 3)
    with pytest.raises(InvalidInputError):
        db.set_compression_fallback_streak("s1", streak)
    assert db.get_compression_fallback_streak("s1") == 3


def test_empty_and_unknown_ids_read_zero_and_write_nothing(db: SessionDB) -> None:
    db.set_compression_fallback_streak("", 5)
    db.set_compression_fallback_streak("ghost", 5)
    assert db.get_compression_fallback_streak("") == 0
    assert db.get_compression_fallback_streak("ghost") == 0
    assert db.get_session("ghost") is None


@pytest.mark.parametrize("stored", ["three", 2.5, b"\x01", -4])
def test_a_stored_value_that_is_not_a_non_negative_integer_reads_as_zero(
    db: SessionDB, stored: object
) -> None:
    db.create_session("s1", "cli")
    conn = sqlite3.connect(db.path)  # what another writer may have left in the column
    with conn:
        conn.execute("UPDATE sessions SET compression_fallback_streak = ? WHERE id = 's1'",
                     (stored,))
    conn.close()
    assert db.get_compression_fallback_streak("s1") == 0


def test_a_cooldown_in_the_future_reads_back_until_it_is_over(db: SessionDB) -> None:
    db.create_session("s1", "cli")
    until = time.time() + 60
    db.record_compression_failure_cooldown("s1", until, "provider rate limit")
    cooldown = db.get_compression_failure_cooldown("s1")
    assert set(cooldown) == {"cooldown_until", "remaining_seconds", "error"}
    assert cooldown["cooldown_until"] == until and cooldown["error"] == "provider rate limit"
    assert 55 < cooldown["remaining_seconds"] <= 60
    db.record_compression_failure_cooldown("s1", time.time() + 0.2)
    assert db.get_compression_failure_cooldown("s1")["error"] is None
    time.sleep(0.25)
    assert db.get_compression_failure_cooldown("s1") is None
    db.record_compression_failure_cooldown("s1", time.time() - 1, "past")
    assert db.get_compression_failure_cooldown("s1") is None
    db.clear_compression_failure_cooldown("s1")
    row = db.get_session("s1")
    assert (row["compression_failure_cooldown_until"], row["compression_failure_error"]) == (
        None, None)


def test_cooldown_calls_for_empty_or_unknown_ids_do_nothing(db: SessionDB) -> None:
    for sid in ("", "ghost"):
        db.record_compression_failure_cooldown(sid, time.time() + 60, "x")
        db.clear_compression_failure_cooldown(sid)
        assert db.get_compression_failure_cooldown(sid) is None
    assert db.get_session("ghost") is None


@pytest.mark.parametrize("until", ["soon", None, float("inf"), float("nan")])
def test_a_cooldown_that_is_not_a_time_is_refused(db: SessionDB, until: object) -> None:
    db.create_session("s1", "cli")
    with pytest.raises(InvalidInputError):
        db.record_compression_failure_cooldown("s1", until)
    assert db.get_compression_failure_cooldown("s1") is None


def test_a_closed_handle_reads_zero_and_the_cooldown_writes_do_not_raise(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = SessionDB(db_path)
    db.create_session("s1", "cli")
    db.set_compression_fallback_streak("s1", 4)
    db.close()
    with caplog.at_level(logging.WARNING, "hermes_state"):
        assert db.get_compression_fallback_streak("s1") == 0
        assert db.record_compression_failure_cooldown("s1", time.time() + 9, "e") is None
        assert db.clear_compression_failure_cooldown("s1") is None
    assert caplog.text.count("answered without the store") == 3
    with pytest.raises(StateDbClosedError):
        db.set_compression_fallback_streak("s1", 1)  # "errors propagate"


@pytest.mark.slow
def test_cooldown_writes_are_logged_not_raised_while_the_store_stays_locked(
    db_path: Path, open_db, hold_write_lock, caplog: pytest.LogCaptureFixture,
) -> None:
    db = open_db(db_path, timing=Timing(write_patience_s=0.3))
    db.create_session("s1", "cli")
    with hold_write_lock(db.path), caplog.at_level(logging.WARNING, "hermes_state"):
        assert db.record_compression_failure_cooldown("s1", time.time() + 60, "e") is None
        assert db.clear_compression_failure_cooldown("s1") is None
    assert "stayed locked" in caplog.text
    assert db.get_compression_failure_cooldown("s1") is None
