"""Repair and restore keep every other process out for their whole window, or refuse.

A maintenance run copies the live store, works on the copy and writes the result back onto
the live file. Every write another process acknowledges must survive that: either it lands
before the copy (and is in it), or it waits until the result is in place (and lands on it),
or it fails loudly with :class:`StateDbLockedError` after its patience. These tests race real
writer processes against the ``hermes-state`` command line, kill the maintenance process in
the middle of its promotion, and check the store afterwards row by row.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import hermes_state_lockowners as lockowners
from hermes_state import (
    SessionDB,
    StateDbInUseError,
    backup_state_db,
    repair_state_db,
    restore_state_db,
)
from hermes_state_quarantine import read_marker, write_marker
from state_helpers import (
    CLI_CODE,
    detach_index_by_hand,
    fill_store,
    every_message,
    has_hot_journal,
    kill_while_promoting,
    process_holding,
)

SEEDS = (1, 2, 3)

# A writer the way a busy gateway writes: open, append three messages, close, again, until
# the file argv[4] exists. Every acknowledged append is printed at once with its row id, uid
# and text; a write whose patience (argv[3] seconds, SQLite's busy timeout shortened to fit)
# ran out prints "locked". Anything else escapes and fails the test. The file argv[5] is
# created once the first append is acknowledged.
WRITER = """
import json, os, random, sys, time, uuid
from hermes_state import SessionDB, StateDbLockedError, Timing
path, seed, patience = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
stop, ready = sys.argv[4], sys.argv[5]
timing = Timing(write_patience_s=patience, transcript_patience_s=patience,
                busy_timeout_s=min(1.0, patience / 3))
rng = random.Random(seed)
n = 0
while not os.path.exists(stop):
    try:
        # No background index rebuild: the store must still need its repair when it runs.
        with SessionDB(path, rebuild_fts=False, timing=timing) as db:
            for _ in range(3):
                uid, text = uuid.uuid4().hex, f"window {seed}.{n}"
                row = db.append_message("w", "user", text, message_uid=uid)
                n += 1
                print(json.dumps({"ack": row, "uid": uid, "content": text}), flush=True)
                if n == 1:
                    open(ready, "w").close()
    except StateDbLockedError as exc:
        print(json.dumps({"locked": exc.reason, "waited": exc.waited_s}), flush=True)
    time.sleep(rng.uniform(0, 0.02))
"""


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Closed store files, built once: ``small`` (~10 MB) and ``big`` (~40 MB)."""
    built = {}
    for name, messages, size in (("small", 2000, 4000), ("big", 3000, 12000)):
        path = tmp_path_factory.mktemp(name) / "state.db"
        fill_store(path, messages, size)
        assert not path.with_name("state.db-wal").exists()
        built[name] = path.read_bytes()
    return built


@pytest.fixture
def store(db_path: Path, templates: dict[str, bytes]) -> Callable[[str], Path]:
    def make(name: str) -> Path:
        db_path.write_bytes(templates[name])
        os.chmod(db_path, 0o600)
        return db_path
    return make


def rows(path: Path, session_id: str) -> list[tuple[int, str, str]]:
    with SessionDB(path, read_only=True) as db:
        return [(m["id"], m["message_uid"], m["content"]) for m in db.get_messages(session_id)]


@pytest.fixture
def writer(
    spawn_python, tmp_path: Path
) -> Iterator[Callable[[Path, int, float], Callable[[], dict[str, Any]]]]:
    """``start(path, seed, patience)`` starts a WRITER; ``stop()`` ends it and returns its
    acknowledged appends and its locked errors."""
    procs: list[subprocess.Popen[str]] = []
    stop_file, ready_file = tmp_path / "stop-writer", tmp_path / "writer-ready"

    def start(path: Path, seed: int, patience: float) -> Callable[[], dict[str, Any]]:
        proc = spawn_python(WRITER, str(path), str(seed), str(patience), str(stop_file),
                            str(ready_file))
        procs.append(proc)
        deadline = time.monotonic() + 30
        while not ready_file.exists():  # looping once it has acknowledged one append
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.01)

        def stop() -> dict[str, Any]:
            stop_file.touch()
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            lines = [json.loads(line) for line in out.splitlines()]
            acks = [line for line in lines if "ack" in line]
            locked = [line for line in lines if "locked" in line]
            assert len(acks) + len(locked) == len(lines), lines
            assert all(x["locked"] == "session_persistence_failed:locked" for x in locked)
            return {"acks": acks, "locked": locked}

        return stop

    yield start
    stop_file.touch()
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def run_until_done(run_python, *args: str, attempts: int = 30) -> dict[str, Any]:
    """Run a maintenance command until it is not refused as in use; its JSON report."""
    refusals = 0
    for _ in range(attempts):
        done = run_python(CLI_CODE, "--json", *args, timeout=120)
        if done.returncode == 0:
            report = json.loads(done.stdout)
            report["refusals"] = refusals
            return report
        assert "in use" in done.stderr, done.stderr  # the only acceptable failure
        refusals += 1
    raise AssertionError(f"{args} was refused {attempts} times")


# --- a writer in the window ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_repair_never_discards_a_write_acknowledged_during_its_window(
    store, writer, run_python, seed: int
) -> None:
    path = store("small")
    detach_index_by_hand(path)
    patience = 0.15 if seed % 2 else 30.0  # some writes fail loudly; others wait it out
    stop = writer(path, seed, patience)
    report = run_until_done(run_python, "--db", str(path), "sessions", "repair")
    time.sleep(0.3)  # more writes after the promotion
    result = stop()

    assert report["promoted"] is True, report
    assert report["after"]["healthy"]
    stored = {uid: (row, content) for row, uid, content in rows(path, "w")}
    for ack in result["acks"]:
        assert stored.get(ack["uid"]) == (ack["ack"], ack["content"]), ack
    assert len(stored) == len(result["acks"])
    assert repair_state_db(path, check_only=True)["healthy"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_restore_never_discards_a_write_acknowledged_during_its_window(
    store, writer, run_python, seed: int, tmp_path: Path
) -> None:
    path = store("small")
    snapshot = backup_state_db(path, tmp_path / "snapshot.db")
    patience = 0.15 if seed % 2 else 30.0
    stop = writer(path, seed, patience)
    report = run_until_done(run_python, "--db", str(path), "restore", str(snapshot))
    time.sleep(0.3)
    result = stop()

    # A restore replaces the store on purpose: what was acknowledged before it is in the
    # previous-store snapshot it took, what came after it is in the live store. Nothing may
    # fall between the two.
    before = {uid: (row, content) for row, uid, content in rows(
        Path(report["previous_snapshot"]), "w")}
    after = {uid: (row, content) for row, uid, content in rows(path, "w")}
    for ack in result["acks"]:
        expected = (ack["ack"], ack["content"])
        assert before.get(ack["uid"]) == expected or after.get(ack["uid"]) == expected, ack
    assert len(before) + len(after) == len(result["acks"])
    assert report["quick_check"] == ["ok"]


# --- kill -9 in the middle of the promotion -------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("command", ["repair", "restore"])
def test_a_promotion_killed_half_way_leaves_the_store_as_it_was_before(
    store, spawn_python, tmp_path: Path, seed: int, command: str
) -> None:
    path = store("big")
    if command == "repair":
        detach_index_by_hand(path)
        args = ["sessions", "repair"]
    else:
        args = ["restore", str(backup_state_db(path, tmp_path / "snapshot.db"))]
        with SessionDB(path) as db:  # the live store differs from the snapshot
            db.append_message("w", "user", "only in the live store")
    before = every_message(path)

    proc = spawn_python(CLI_CODE, "--db", str(path), *args)
    kill_while_promoting(proc, nth=1 + seed % 2)
    assert has_hot_journal(path)

    with SessionDB(path, rebuild_fts=False) as db:  # a writable open rolls the journal back
        assert db.get_meta("fts_stale") == ("test" if command == "repair" else None)
    assert not has_hot_journal(path)
    assert every_message(path) == before
    health = repair_state_db(path, check_only=True)
    assert health["integrity"] == ["ok"]
    assert health["healthy"] is (command == "restore")


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_writers_waiting_on_a_killed_promotion_lose_nothing(
    store, writer, spawn_python, seed: int
) -> None:
    path = store("big")
    detach_index_by_hand(path)
    stop = writer(path, seed, 30.0)
    for _ in range(30):
        proc = spawn_python(CLI_CODE, "--db", str(path), "sessions", "repair")
        try:
            kill_while_promoting(proc, nth=1)
            break
        except AssertionError:  # refused while the writer had the file open: try again
            assert proc.stderr is not None and proc.returncode == 1
    else:
        raise AssertionError("the repair never reached its promotion")
    time.sleep(0.3)
    result = stop()

    assert not has_hot_journal(path)  # the first writer in rolled it back
    stored = {uid: (row, content) for row, uid, content in rows(path, "w")}
    for ack in result["acks"]:
        assert stored.get(ack["uid"]) == (ack["ack"], ack["content"]), ack
    assert len(stored) == len(result["acks"])
    assert repair_state_db(path, check_only=True)["integrity"] == ["ok"]


# --- refusals -------------------------------------------------------------------------------


def test_a_handle_held_by_the_caller_is_refused_at_once_and_keeps_its_locks(
    store, tmp_path: Path
) -> None:
    path = store("small")
    detach_index_by_hand(path)
    snapshot = backup_state_db(path, tmp_path / "snapshot.db")
    with SessionDB(path, rebuild_fts=False) as db:
        db.append_message("w", "user", "held")
        for attempt in (lambda: repair_state_db(path), lambda: restore_state_db(snapshot, path)):
            began = time.monotonic()
            with pytest.raises(StateDbInUseError) as caught:
                attempt()
            assert time.monotonic() - began < 2.0
            assert "this process" in str(caught.value)
        if os.path.exists(lockowners.PROC_LOCKS_PATH):  # the handle's own locks are intact
            assert any(h.pid == os.getpid() for h in lockowners.lock_holders(
                path, exclude_pids=()))
        db.append_message("w", "user", "still writable")
    assert [c for _, _, c in rows(path, "w")] == ["held", "still writable"]
    assert repair_state_db(path)["promoted"] is True


def test_another_process_holding_the_store_is_refused_and_named(
    store, tmp_path: Path
) -> None:
    path = store("small")
    detach_index_by_hand(path)
    before = path.read_bytes()
    with process_holding(path) as holder:
        began = time.monotonic()
        with pytest.raises(StateDbInUseError) as caught:
            repair_state_db(path)
        assert time.monotonic() - began < 2.0
        if os.path.exists(lockowners.PROC_LOCKS_PATH):
            assert any(f"PID {holder.pid}" in h for h in caught.value.holders)
    assert path.read_bytes() == before
    assert not path.with_name("state.db-journal").exists()


def test_without_a_lock_table_sqlites_own_lock_decides(
    store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """/proc/locks only names holders: with no lock table a free store is still repaired,
    and a held one is still refused."""
    monkeypatch.setenv(lockowners.PROC_LOCKS_ENV, str(tmp_path / "no-lock-table"))
    path = store("small")
    detach_index_by_hand(path)
    with process_holding(path):
        with pytest.raises(StateDbInUseError) as caught:
            repair_state_db(path)
        assert caught.value.holders == []
    assert repair_state_db(path)["promoted"] is True


def test_a_maintenance_run_holding_the_admission_lock_refuses_another(
    store, spawn_python
) -> None:
    path = store("big")
    detach_index_by_hand(path)
    first = spawn_python(CLI_CODE, "--db", str(path), "sessions", "repair")
    try:
        assert first.stderr is not None
        assert "copying" in first.stderr.readline()
        with pytest.raises(StateDbInUseError) as caught:
            repair_state_db(path)
        assert "admission lock" in str(caught.value)
    finally:
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err


# --- the durable quarantine marker ----------------------------------------------------------


def test_a_promotion_clears_the_quarantine_marker_and_a_refusal_keeps_it(
    store, tmp_path: Path
) -> None:
    path = store("small")
    detach_index_by_hand(path)
    snapshot = backup_state_db(path, tmp_path / "snapshot.db")
    write_marker(path, "damaged")
    with process_holding(path), pytest.raises(StateDbInUseError):
        repair_state_db(path)
    assert read_marker(path) is not None
    assert repair_state_db(path)["promoted"] is True
    assert read_marker(path) is None

    write_marker(path, "damaged again")
    restore_state_db(snapshot, path)
    assert read_marker(path) is None


def test_a_restore_onto_a_missing_store_creates_it_private_with_no_previous_snapshot(
    store, tmp_path: Path
) -> None:
    snapshot = backup_state_db(store("small"), tmp_path / "snapshot.db")
    target = tmp_path / "elsewhere" / "state.db"
    report = restore_state_db(snapshot, target)
    assert report["previous_snapshot"] is None and report["rolled_back_journal"] is False
    assert report["quick_check"] == ["ok"]
    assert os.stat(target).st_mode & 0o777 == 0o600
    assert every_message(target) == every_message(snapshot)
    with SessionDB(target, rebuild_fts=False) as db:
        assert db.get_session("bulk") is not None
