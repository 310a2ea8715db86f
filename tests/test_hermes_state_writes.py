"""The write policy: the backoff between attempts, the verdict on each error a write meets,
the policy read from the module's constants at call time, and the locked path of statements
that cannot run in a transaction. Errors are real SQLite errors (a locked file, a file of
random bytes, a constraint), never constructed."""

from __future__ import annotations

import random
import sqlite3
import time
from pathlib import Path

import pytest
from conftest import HoldWriteLock, OpenDb
from state_helpers import Connections
from hypothesis import given
from hypothesis import strategies as st

import hermes_state
import hermes_state_fts as fts
import hermes_state_writes as writes
from hermes_state import InvalidInputError, InvalidTypeError, SessionDB, Timing
from hermes_state_writes import RetryPolicy, Verdict, classify, delay

POLICY = RetryPolicy(
    patience_s=20.0, fast_window_s=2.0, fast_pause_s=(0.020, 0.150), slow_pause_s=(0.250, 1.0)
)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_pauses_are_short_in_the_fast_window_and_long_after_it(seed: int) -> None:
    rng = random.Random(seed)
    fast = [delay(rng.uniform(0, 1.99), POLICY, rng) for _ in range(500)]
    slow = [delay(rng.uniform(2.0, 18.0), POLICY, rng) for _ in range(500)]
    assert all(p is not None and 0.020 <= p <= 0.150 for p in fast)
    assert all(p is not None and 0.250 <= p <= 1.0 for p in slow)
    assert len(set(fast)) > 400, "random pauses, so that contending writers do not lockstep"


@given(
    elapsed=st.floats(min_value=0, max_value=100, allow_nan=False),
    patience=st.floats(min_value=0.001, max_value=60, allow_nan=False),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_a_pause_never_outlasts_the_patience_and_none_comes_once_it_is_spent(
    elapsed: float, patience: float, seed: int
) -> None:
    policy = RetryPolicy(patience, 2.0, (0.020, 0.150), (0.250, 1.0))
    pause = delay(elapsed, policy, random.Random(seed))
    if elapsed >= patience:
        assert pause is None
    else:
        assert pause is not None and 0.001 <= pause <= max(patience - elapsed, 0.001)


def test_delay_is_a_pure_function_of_its_inputs() -> None:
    assert [delay(1.0, POLICY, random.Random(7)) for _ in range(3)] == [
        delay(1.0, POLICY, random.Random(7))
    ] * 3


# --- classification, on real errors --------------------------------------------------------------


@pytest.fixture
def lock_error(tmp_path: Path) -> sqlite3.Error:
    path = tmp_path / "locked.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA journal_mode = WAL")
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN IMMEDIATE")
    other = sqlite3.connect(path, isolation_level=None, timeout=0)
    try:
        with pytest.raises(sqlite3.OperationalError) as caught:
            other.execute("BEGIN IMMEDIATE")
    finally:
        other.close()
        holder.close()
    return caught.value


@pytest.fixture
def corruption_error(tmp_path: Path) -> sqlite3.Error:
    path = tmp_path / "random.db"
    path.write_bytes(random.Random(5).randbytes(8192))
    conn = sqlite3.connect(path)
    try:
        with pytest.raises(sqlite3.DatabaseError) as caught:
            conn.execute("SELECT * FROM sqlite_master").fetchall()
    finally:
        conn.close()
    return caught.value


@pytest.fixture
def constraint_error() -> sqlite3.Error:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE t (x UNIQUE)")
    conn.execute("INSERT INTO t VALUES (1)")
    with pytest.raises(sqlite3.IntegrityError) as caught:
        conn.execute("INSERT INTO t VALUES (1)")
    conn.close()
    return caught.value


class Prover:
    """``fts_only`` for classify: answers as told and counts the questions."""

    def __init__(self, answer: bool) -> None:
        self.answer, self.asked = answer, 0

    def __call__(self, exc: BaseException) -> bool:
        self.asked += 1
        return self.answer


def test_a_lock_error_is_retried_without_reading_the_file(lock_error: sqlite3.Error) -> None:
    prover = Prover(True)
    assert classify(lock_error, index_detached=False, fts_only=prover) is Verdict.RETRY
    assert classify(lock_error, index_detached=True, fts_only=prover) is Verdict.RETRY
    assert prover.asked == 0


def test_corruption_detaches_the_index_once_when_proven_fts_only_else_quarantines(
    corruption_error: sqlite3.Error,
) -> None:
    assert classify(corruption_error, index_detached=False, fts_only=Prover(True)) is (
        Verdict.DETACH_INDEX
    )
    assert classify(corruption_error, index_detached=False, fts_only=Prover(False)) is (
        Verdict.QUARANTINE
    )
    again = Prover(True)
    assert classify(corruption_error, index_detached=True, fts_only=again) is Verdict.QUARANTINE
    assert again.asked == 0, "a second proof after detaching is not believed"


def test_out_of_memory_detaches_the_index_only_when_it_is_to_blame() -> None:
    assert classify(MemoryError(), index_detached=False, fts_only=Prover(True)) is (
        Verdict.DETACH_INDEX
    )
    assert classify(MemoryError(), index_detached=False, fts_only=Prover(False)) is Verdict.RAISE
    assert classify(MemoryError(), index_detached=True, fts_only=Prover(True)) is Verdict.RAISE


def test_any_other_error_is_raised_without_reading_the_file(
    constraint_error: sqlite3.Error,
) -> None:
    prover = Prover(True)
    assert classify(constraint_error, index_detached=False, fts_only=prover) is Verdict.RAISE
    assert classify(ValueError("bad"), index_detached=False, fts_only=prover) is Verdict.RAISE
    assert prover.asked == 0


# --- the policy a write uses, and the locked path -------------------------------------------------


@pytest.mark.slow
def test_each_write_waits_the_patience_of_its_kind(
    db_path: Path, hold_write_lock: HoldWriteLock
) -> None:
    timing = Timing(activity_patience_s=0.05, write_patience_s=0.3)
    with SessionDB(db_path, timing=timing) as db:
        db.create_session("s", "cli")
        with hold_write_lock(db.path):
            start = time.monotonic()
            db.update_session_cwd("s", "/srv/app")  # skipped once its patience is spent
            stamp_waited = time.monotonic() - start
            start = time.monotonic()
            with pytest.raises(hermes_state.StateDbLockedError):
                db.set_session_title("s", "locked out")
            write_waited = time.monotonic() - start
        assert stamp_waited < 0.05 + db.timing.busy_timeout_s + 0.5
        assert 0.3 <= write_waited < 0.3 + db.timing.busy_timeout_s + 0.5
        assert db.get_session("s")["cwd"] is None and db.get_session_title("s") is None


def test_vacuum_and_checkpoint_run_outside_any_transaction(
    db_path: Path, open_db: OpenDb
) -> None:
    connections = Connections()
    db = open_db(db_path, on_connect=connections)
    traced = connections.of("handle")
    db.create_session("s", "cli")
    traced.clear()
    assert db.vacuum() == 3
    optimize = [f"INSERT INTO {t}({t}) VALUES ('optimize')" for t in fts.FTS_TABLES]
    merge = traced.index("BEGIN IMMEDIATE"), traced.index("COMMIT")
    assert [s for s in traced[merge[0]:merge[1]] if s.startswith("INSERT")] == optimize
    # the checkpoint, then VACUUM last, each outside any transaction of the handle
    checkpoint = traced[merge[1] + 1:-1]
    if db.wal_reset_exposed:
        assert checkpoint == ["BEGIN IMMEDIATE", "COMMIT"]
    else:
        assert checkpoint == [writes.TRUNCATE_CHECKPOINT_SQL]
    assert traced[-1] == "VACUUM"
    traced.clear()
    db.checkpoint()
    if db.wal_reset_exposed:  # the helper checkpoints while the handle holds the write lock
        assert traced == ["BEGIN IMMEDIATE", "COMMIT"]
    else:
        assert traced == [writes.CHECKPOINT_SQL]


@pytest.mark.slow
def test_a_vacuum_waits_for_the_lock_another_process_holds(
    db: SessionDB, hold_write_lock: HoldWriteLock
) -> None:
    db.create_session("s", "cli")
    with hold_write_lock(db.path, seconds=1.5):
        start = time.monotonic()
        db.vacuum()
        waited = time.monotonic() - start
    assert waited >= 1.0 and db.write_retries >= 1
    assert db.get_session("s") is not None


def test_the_write_kinds_are_the_three_the_module_documents() -> None:
    assert set(writes.WriteKind.__args__) == {"write", "transcript", "activity"}
    for kind in writes.WriteKind.__args__:
        assert Timing().policy(kind).patience_s > 0


@pytest.mark.parametrize(
    ("figures", "error"),
    [
        ({"write_patience_s": -1.0}, InvalidInputError),
        ({"transcript_patience_s": float("nan")}, InvalidInputError),
        ({"activity_patience_s": float("inf")}, InvalidInputError),
        ({"busy_timeout_s": "1"}, InvalidTypeError),
        ({"read_busy_timeout_s": True}, InvalidTypeError),
        ({"fast_pause_s": (0.2, 0.1)}, InvalidInputError),
        ({"slow_pause_s": 0.5}, InvalidInputError),
        ({"checkpoint_every": 0}, InvalidInputError),
        ({"checkpoint_every": 2.5}, InvalidInputError),
    ],
)
def test_a_timing_refuses_figures_that_are_no_durations(
    figures: dict[str, object], error: type[Exception]
) -> None:
    with pytest.raises(error) as refused:
        Timing(**figures)  # type: ignore[arg-type]
    assert refused.value.argument == next(iter(figures))  # type: ignore[attr-defined]


def test_a_handle_refuses_a_timing_of_another_type(db_path: Path) -> None:
    with pytest.raises(InvalidTypeError) as refused:
        SessionDB(db_path, timing={"write_patience_s": 1.0})  # type: ignore[arg-type]
    assert refused.value.argument == "timing" and not db_path.exists()


def test_a_handle_checkpoints_after_the_commits_its_timing_names(
    open_db: OpenDb, tmp_path: Path
) -> None:
    often = open_db(tmp_path / "often.db", timing=Timing(checkpoint_every=3))
    seldom = open_db(tmp_path / "seldom.db")
    for db in (often, seldom):
        db.create_session("s", "cli")
        db.last_checkpoint = None
        for n in range(3):
            db.append_message("s", "user", f"message {n}")
    assert often.last_checkpoint is not None and seldom.last_checkpoint is None
