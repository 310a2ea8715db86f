"""Damage, once it exists, is kept as it is until someone mends it on purpose: a -wal damaged in
the middle is never checkpointed by the next writable open, a repair that cannot promote leaves
the main file and the -wal byte for byte, whoever meets the damage first (readers included)
records it in the marker beside the file, and a marker that cannot be used keeps the
quarantine.

Every scenario runs on really damaged files, with the writes that matter acknowledged to, and
the damage met by, other processes (killed with SIGKILL where the story needs it)."""

from __future__ import annotations

import json
import random
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import (
    file_state,
    leave_committed_wal,
    overwrite,
    subprocess_env,
    table_pages,
)
from state_helpers import (
    append_and_die,
    append_until_corrupt,
    flip_byte,
    point_freelist_at_live_pages,
    release_process,
    store_of,
    wal_frame_offset,
)

import hermes_state_quarantine as quarantine
from hermes_state import (
    SessionDB,
    StateDbCorruptError,
    backup_state_db,
    recover_state_db,
    repair_state_db_schema,
    restore_state_db,
)
from hermes_state_maintenance import prune_snapshots
from hermes_state_openability import db_opens_cleanly

SEEDS = [1, 2, 3]
PAGE = 4096


def cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hermes_state_cli", *args],
        env=subprocess_env({"HERMES_HOME": str(home)}), capture_output=True, text=True,
        timeout=120, check=False,
    )


def run_child(code: str, *args: str, home: Path) -> dict[str, Any]:
    """Run ``code`` in another process; it prints one JSON report as its last line."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=subprocess_env({"HERMES_HOME": str(home)}),
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return report


def recovered_ids(db_path: Path, out: Path) -> set[int]:
    """The message ids ``recover`` gets out of the store (the store is only read)."""
    recover_state_db(db_path, out)
    conn = sqlite3.connect(f"file:{out}?immutable=1", uri=True)
    try:
        return {r[0] for r in conn.execute("SELECT id FROM messages")}
    finally:
        conn.close()


def marker_of(db_path: Path) -> dict[str, Any] | None:
    path = quarantine.marker_path(db_path)
    return json.loads(path.read_text()) if path.exists() else None


def damage_a_middle_frame(
    db_path: Path, rng: random.Random | None = None, offset: int = 7
) -> int:
    """Flip one bit in a frame in the middle of the store's -wal: one of its middle third picked
    by ``rng``, at a random byte, else its middle frame at ``offset``; returns the frame."""
    wal = db_path.with_name("state.db-wal")
    frames = (wal.stat().st_size - 32) // (24 + PAGE)
    if rng is None:
        frame, byte = frames // 2, offset
    else:
        frame, byte = rng.randrange(frames // 3, 2 * frames // 3), rng.randrange(PAGE)
    flip_byte(wal, wal_frame_offset(wal, frame) + 24 + byte)
    return frame


def make_store(db_path: Path, messages: int = 300) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        for n in range(messages):
            db.append_message("s", "user", f"message {n} " + "x" * 200)


# The next start of a gateway on argv[1]: argv[3] appends to session argv[2], each refused one
# counted; then it closes as a gateway does.
_GATEWAY_RESTART = r"""
import json, sys
from hermes_state import SessionDB, StateDbCorruptError
db = SessionDB(sys.argv[1])
report = {"born_quarantined": db.quarantined, "acked": [], "refused": 0, "spooled_to": None}
for n in range(int(sys.argv[3])):
    try:
        report["acked"].append(db.append_message(sys.argv[2], "user", f"after restart {n}"))
    except StateDbCorruptError as exc:
        report["refused"] += 1
        report["spooled_to"] = None if exc.spooled_to is None else str(exc.spooled_to)
db.close()
print(json.dumps(report), flush=True)
"""


# ---------------------------------------------------------------------------------------------
# A -wal damaged in the middle, met by the next ordinary writable open
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_writable_open_never_checkpoints_a_wal_damaged_in_the_middle(
    seed: int, db_path: Path, hermes_home: Path, tmp_path: Path
) -> None:
    store_of(db_path, "base", 1, 30, seed)
    acknowledged = append_and_die(db_path, "base-0", 40)  # a writer killed after 40 acks
    frame = damage_a_middle_frame(db_path, random.Random(seed))
    damaged = file_state(db_path)

    restart = run_child(_GATEWAY_RESTART, str(db_path), "base-0", "3", home=hermes_home)
    assert restart["born_quarantined"] and restart["acked"] == [] and restart["refused"] == 3
    assert restart["spooled_to"] == str(hermes_home / "sessions" / "base-0.jsonl")
    assert file_state(db_path) == damaged  # main file and -wal byte for byte
    marker = marker_of(db_path)
    assert marker is not None and marker["inode"] == db_path.stat().st_ino
    assert f"the -wal is damaged at frame {frame}" in marker["reason"]

    # recover still folds every commit after the damaged frame
    assert set(acknowledged) <= recovered_ids(db_path, tmp_path / "recovered.db")
    # and the next restart starts quarantined from the marker
    again = run_child(_GATEWAY_RESTART, str(db_path), "base-0", "1", home=hermes_home)
    assert again["born_quarantined"] and again["acked"] == []
    assert file_state(db_path) == damaged


@pytest.mark.slow
@pytest.mark.parametrize(("field", "offset", "bit"),
                         [("magic", 0, 0x10), ("byte order", 3, 0x01), ("page size", 10, 0x10)])
def test_a_writable_open_never_checkpoints_a_wal_whose_header_says_it_is_none(
    field: str, offset: int, bit: int, db_path: Path, hermes_home: Path, tmp_path: Path
) -> None:
    """A flipped bit in the -wal header's magic number or page size: SQLite takes the file for
    no WAL, or for one in the other byte order whose checksum fails, and reads none of its
    commits; the first checkpoint would delete them all."""
    store_of(db_path, "base", 1, 30, 7)
    acknowledged = append_and_die(db_path, "base-0", 40)
    flip_byte(db_path.with_name("state.db-wal"), offset, bit)
    damaged = file_state(db_path)

    restart = run_child(_GATEWAY_RESTART, str(db_path), "base-0", "3", home=hermes_home)
    assert restart["born_quarantined"] and restart["acked"] == [] and restart["refused"] == 3
    assert file_state(db_path) == damaged  # main file and -wal byte for byte
    marker = marker_of(db_path)
    assert marker is not None and "the -wal is damaged at its header" in marker["reason"]
    assert set(acknowledged) <= recovered_ids(db_path, tmp_path / "recovered.db")


# A read-only handle on argv[1] that has read the store and stays open until stdin closes.
_READER_THAT_STAYS = r"""
import sys
from hermes_state import SessionDB
db = SessionDB(sys.argv[1], read_only=True)
db.session_count()
print("ready", flush=True)
sys.stdin.read()
db.close()
"""


def test_a_writer_that_opens_after_a_reader_indexed_the_damaged_wal_writes_nothing(
    db_path: Path, hermes_home: Path, tmp_path: Path
) -> None:
    """Another client opened the store first after the crash and keeps it open: SQLite's
    index of the -wal (shared through -shm) already stops at the damage, and a write would
    go over the later commits."""
    store_of(db_path, "base", 1, 30, 5)
    acknowledged = append_and_die(db_path, "base-0", 30)
    damage_a_middle_frame(db_path, offset=1234)
    damaged = file_state(db_path)
    reader = subprocess.Popen(
        [sys.executable, "-c", _READER_THAT_STAYS, str(db_path)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, env=subprocess_env({"HERMES_HOME": str(hermes_home)}))
    try:
        assert reader.stdout is not None and reader.stdout.readline().strip() == "ready"
        restart = run_child(_GATEWAY_RESTART, str(db_path), "base-0", "5", home=hermes_home)
        assert restart["born_quarantined"] and restart["acked"] == []
    finally:
        release_process(reader)
    assert file_state(db_path) == damaged
    assert set(acknowledged) <= recovered_ids(db_path, tmp_path / "recovered.db")


def test_a_wal_whose_tail_was_torn_or_reset_is_no_damage(db_path: Path) -> None:
    """Frames after the last commit (a transaction killed before it committed) and frames of
    an earlier WAL generation are what a -wal normally holds: no quarantine."""
    store_of(db_path, "base", 1, 20, 1)
    append_and_die(db_path, "base-0", 5)
    wal = db_path.with_name("state.db-wal")
    frames = (wal.stat().st_size - 32) // (24 + PAGE)
    flip_byte(wal, wal_frame_offset(wal, frames) + 24 + 100)  # the very last frame
    with SessionDB(db_path) as db:
        assert not db.quarantined
        db.append_message("base-0", "user", "goes in")
    assert marker_of(db_path) is None


# ---------------------------------------------------------------------------------------------
# A repair that cannot promote
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_repair_that_cannot_promote_leaves_the_file_and_its_wal_byte_for_byte(
    seed: int, db_path: Path, hermes_home: Path, tmp_path: Path
) -> None:
    damaged, before = freelist_damage_met_by_a_writer(db_path, seed, tmp_path)
    repair = cli(hermes_home, "--db", str(db_path), "sessions", "repair")
    if repair.returncode == 0:  # where the damage falls, the rebuilt copy may check clean
        assert "promoted" in repair.stdout
        with SessionDB(db_path) as db:
            assert {m["id"] for s in ("live-0", "live-1") for m in db.get_messages(s)} == before
        return
    assert repair.returncode == 1, repair.stdout
    assert "kept unchanged" in repair.stdout
    assert file_state(db_path) == damaged
    assert recovered_ids(db_path, tmp_path / "after.db") == before


def freelist_damage_met_by_a_writer(
    db_path: Path, seed: int, tmp_path: Path
) -> tuple[dict[str, str | None], set[int]]:
    """A store whose freelist names live pages, written to by another process until it met
    the damage (its acknowledged rows are in the -wal); the files' state and the message ids
    recover gets out of them."""
    store_of(db_path, "live", 3, 80, seed)
    with SessionDB(db_path) as db:
        db.delete_session("live-2")  # its pages go to the freelist
    point_freelist_at_live_pages(db_path, "messages", seed)
    acknowledged = append_until_corrupt(db_path, "live-0")
    damaged = file_state(db_path)
    assert damaged["state.db-wal"] is not None
    before = recovered_ids(db_path, tmp_path / "before.db")
    assert set(acknowledged) <= before
    return damaged, before


def test_no_maintenance_command_writes_or_checkpoints_a_damaged_store(
    db_path: Path, hermes_home: Path, tmp_path: Path
) -> None:
    """Damage in the record with committed frames in the -wal, found by ``doctor`` first:
    from then on no command changes a byte of either file."""
    make_store(db_path, messages=80)
    with SessionDB(db_path) as db:
        db.end_session("s", "done")  # so that prune has something to delete
    leave_committed_wal(db_path)
    leaves = table_pages(db_path, "messages", "leaf")
    overwrite(db_path, (leaves[1] - 1) * PAGE, random.Random(6).randbytes(PAGE))
    damaged = file_state(db_path)
    for args in (("doctor",), ("sessions", "repair"), ("sessions", "repair", "--check-only"),
                 ("doctor", "--full"), ("backup",),
                 ("sessions", "prune", "--older-than", "0", "--yes"),
                 ("sessions", "delete", "s", "--yes"),
                 ("sessions", "export", "-o", str(tmp_path / "out.jsonl"))):
        done = cli(hermes_home, "--db", str(db_path), *args)
        assert done.returncode != 0, (args, done.stdout)
        assert file_state(db_path) == damaged, args
    assert marker_of(db_path) is not None


def test_repair_refuses_a_store_whose_wal_is_damaged_before_taking_it(
    db_path: Path, hermes_home: Path
) -> None:
    store_of(db_path, "base", 1, 30, 1)
    append_and_die(db_path, "base-0", 12)
    damage_a_middle_frame(db_path, offset=7)
    damaged = file_state(db_path)
    repair = cli(hermes_home, "--db", str(db_path), "--json", "sessions", "repair")
    assert repair.returncode == 1
    report = json.loads(repair.stdout)
    assert not report["promoted"] and "-wal is damaged" in report["error"]
    assert file_state(db_path) == damaged


def test_the_open_probe_and_the_schema_repair_never_checkpoint_a_damaged_file(
    db_path: Path,
) -> None:
    make_store(db_path, messages=80)
    leave_committed_wal(db_path)
    leaves = table_pages(db_path, "messages", "leaf")
    overwrite(db_path, (leaves[len(leaves) // 2] - 1) * PAGE, random.Random(4).randbytes(PAGE))
    damaged = file_state(db_path)
    assert db_opens_cleanly(db_path)
    assert file_state(db_path) == damaged
    result = repair_state_db_schema(db_path, backup=False)
    assert not result["repaired"] and "damaged tables: messages" in (result["error"] or "")
    assert file_state(db_path) == damaged


# ---------------------------------------------------------------------------------------------
# Markers that cannot be used
# ---------------------------------------------------------------------------------------------

# Markers that are JSON objects but name no file, given the file's (device, inode).
UNUSABLE_MARKERS: list[Callable[[int, int], dict[str, Any]]] = [
    lambda dev, ino: {},
    lambda dev, ino: {"device": str(dev), "inode": str(ino)},  # both as text
    lambda dev, ino: {"device": None, "inode": ino},
    lambda dev, ino: {"device": dev, "inode": True},
    lambda dev, ino: {"reason": "damaged", "inode": ino},
]


def unusable_marker(index: int, db_path: Path) -> str:
    st = db_path.stat()
    return json.dumps(UNUSABLE_MARKERS[index](st.st_dev, st.st_ino))


@pytest.mark.parametrize("index", range(len(UNUSABLE_MARKERS)))
def test_a_marker_that_names_no_file_keeps_the_quarantine(
    index: int, db_path: Path, hermes_home: Path
) -> None:
    make_store(db_path, messages=5)
    text = unusable_marker(index, db_path)
    quarantine.marker_path(db_path).write_text(text)
    with SessionDB(db_path) as db:
        assert db.quarantined
        with pytest.raises(StateDbCorruptError):
            db.append_message("s", "user", "kept on disk")
    assert quarantine.marker_path(db_path).read_text() == text
    doctor = cli(hermes_home, "--db", str(db_path), "doctor")
    assert doctor.returncode == 1
    assert "marker that cannot be read" in doctor.stdout
    assert "names no file" in doctor.stdout


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_restarted_writer_never_writes_past_a_marker_that_names_no_file(
    seed: int, db_path: Path, hermes_home: Path
) -> None:
    make_store(db_path, messages=80)
    leave_committed_wal(db_path)
    rng = random.Random(seed)
    leaves = table_pages(db_path, "messages", "leaf")
    overwrite(db_path, (rng.choice(leaves[:-1]) - 1) * PAGE, rng.randbytes(PAGE))
    text = unusable_marker(seed, db_path)
    quarantine.marker_path(db_path).write_text(text)
    damaged = file_state(db_path)

    restart = run_child(_GATEWAY_RESTART, str(db_path), "s", "20", home=hermes_home)
    assert restart["born_quarantined"] and restart["acked"] == [] and restart["refused"] == 20
    assert file_state(db_path) == damaged
    assert quarantine.marker_path(db_path).read_text() == text


def test_a_marker_naming_another_file_by_number_is_still_dropped(db_path: Path) -> None:
    make_store(db_path, messages=5)
    st = db_path.stat()
    quarantine.marker_path(db_path).write_text(
        json.dumps({"device": st.st_dev, "inode": st.st_ino + 1, "reason": "another file"}))
    with SessionDB(db_path) as db:
        assert not db.quarantined
        db.append_message("s", "user", "into this file")
    assert not quarantine.marker_path(db_path).exists()


# ---------------------------------------------------------------------------------------------
# Damage found by readers is recorded
# ---------------------------------------------------------------------------------------------

# A read-only handle on argv[1] reads every message of session argv[2].
_READ_ONLY_READER = r"""
import json, sys
from hermes_state import SessionDB, StateDbCorruptError
report = {"error": None, "notes": []}
with SessionDB(sys.argv[1], read_only=True) as db:
    try:
        db.get_messages(sys.argv[2])
    except StateDbCorruptError as exc:
        report["error"] = str(exc)
        report["notes"] = getattr(exc, "__notes__", [])
print(json.dumps(report), flush=True)
"""

READERS = {
    "read-only handle": None,
    "sessions show": ("sessions", "show", "s"),
    "sessions export": ("sessions", "export", "-o", "{out}"),
    "doctor": ("doctor",),
    "doctor --full": ("doctor", "--full"),
}


@pytest.mark.slow
@pytest.mark.parametrize(("reader", "seed"), [
    ("read-only handle", 1), ("read-only handle", 2), ("read-only handle", 3),
    ("sessions show", 1), ("sessions export", 2), ("doctor", 3), ("doctor --full", 1),
])
def test_damage_a_reader_meets_is_recorded_and_the_next_writer_acks_nothing_into_it(
    reader: str, seed: int, db_path: Path, hermes_home: Path, tmp_path: Path
) -> None:
    make_store(db_path, messages=80)
    rng = random.Random(seed)
    leaves = table_pages(db_path, "messages", "leaf")
    overwrite(db_path, (rng.choice(leaves[1:-1]) - 1) * PAGE, rng.randbytes(PAGE))
    damaged = file_state(db_path)

    args = READERS[reader]
    if args is None:
        report = run_child(_READ_ONLY_READER, str(db_path), "s", home=hermes_home)
        assert report["error"] and any("recorded" in n for n in report["notes"])
    else:
        done = cli(hermes_home, "--db", str(db_path),
                   *(a.format(out=tmp_path / "out.jsonl") for a in args))
        assert done.returncode != 0, done.stdout
        assert "recorded" in done.stdout + done.stderr
    marker = marker_of(db_path)
    assert marker is not None and marker["inode"] == db_path.stat().st_ino
    assert file_state(db_path) == damaged

    writer = run_child(_GATEWAY_RESTART, str(db_path), "s", "60", home=hermes_home)
    assert writer["born_quarantined"] and writer["acked"] == [] and writer["refused"] == 60
    assert file_state(db_path) == damaged


# A read-only handle on argv[1] whose marker cannot be written (a directory stands where the
# marker's temporary file goes) reads every message of session "s".
_READER_WITHOUT_MARKER = r"""
import json, logging, os, sys
from hermes_state import SessionDB, StateDbCorruptError
os.mkdir(f"{sys.argv[1]}-quarantine.{os.getpid()}.tmp")
warnings = []
handler = logging.Handler(logging.WARNING)
handler.emit = lambda record: warnings.append(record.getMessage())
logging.getLogger("hermes_state").addHandler(handler)
report = {"notes": [], "warnings": warnings}
with SessionDB(sys.argv[1], read_only=True) as db:
    try:
        db.get_messages("s")
    except StateDbCorruptError as exc:
        report["notes"] = getattr(exc, "__notes__", [])
print(json.dumps(report), flush=True)
"""


def test_a_reader_that_cannot_write_the_marker_says_so(
    db_path: Path, hermes_home: Path
) -> None:
    make_store(db_path, messages=80)
    leaves = table_pages(db_path, "messages", "leaf")
    overwrite(db_path, (leaves[1] - 1) * PAGE, random.Random(7).randbytes(PAGE))
    damaged = file_state(db_path)
    report = run_child(_READER_WITHOUT_MARKER, str(db_path), home=hermes_home)
    assert any("could not be recorded" in note for note in report["notes"])
    assert any("could not write the quarantine marker" in w for w in report["warnings"])
    assert marker_of(db_path) is None and file_state(db_path) == damaged


def test_doctor_records_a_wal_damaged_in_the_middle(db_path: Path, hermes_home: Path) -> None:
    store_of(db_path, "base", 1, 30, 2)
    append_and_die(db_path, "base-0", 12)
    damage_a_middle_frame(db_path, offset=99)
    damaged = file_state(db_path)
    doctor = cli(hermes_home, "--db", str(db_path), "--json", "doctor")
    assert doctor.returncode == 1
    report = json.loads(doctor.stdout)
    assert report["quarantine"]["inode"] == db_path.stat().st_ino
    assert any("the damage is recorded in" in p for p in report["problems"])
    assert file_state(db_path) == damaged
    # integrity_check reads only what SQLite reads: the quarantine is not cleared on its word
    cleared = cli(hermes_home, "--db", str(db_path), "doctor", "--clear-quarantine")
    assert cleared.returncode == 1 and "-wal is damaged" in cleared.stderr
    assert marker_of(db_path) is not None and file_state(db_path) == damaged


# Appends to a session of its own on argv[1] until killed, a long message now and then (frames
# of many pages) and a compaction every 15 (a whole rewrite of the session).
_BUSY_WRITER = r"""
import os, sys
from hermes_state import SessionDB
db = SessionDB(sys.argv[1])
sid = f"w{os.getpid()}"
db.create_session(sid, "cli")
n = 0
while True:
    n += 1
    db.append_message(sid, "user", f"m{n} " + "x" * (30_000 if n % 4 == 0 else 100))
    if n % 15 == 0:
        seen = db.get_messages(sid)
        db.archive_and_compact(sid, [{"role": "user", "content": f"summary {n}"}],
                               seen_through_id=seen[-1]["id"])
"""


@pytest.mark.slow
def test_doctor_beside_busy_writers_finds_no_damage_in_their_wal(
    db_path: Path, hermes_home: Path
) -> None:
    """doctor reads the -wal while writers append to it and start it over: a frame it reads
    half-written, or frames of two generations, are no damage, and the store is not
    quarantined (it was, within a few runs)."""
    SessionDB(db_path).close()
    env = subprocess_env({"HERMES_HOME": str(hermes_home)})
    writers = [subprocess.Popen([sys.executable, "-c", _BUSY_WRITER, str(db_path)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
               for _ in range(3)]
    try:
        for _ in range(8):
            doctor = cli(hermes_home, "--db", str(db_path), "--json", "doctor")
            assert "wal_damage" not in json.loads(doctor.stdout), doctor.stdout
            assert marker_of(db_path) is None
        assert all(writer.poll() is None for writer in writers)
    finally:
        for writer in writers:
            writer.kill()
            writer.communicate()


def test_damage_only_in_the_search_index_is_not_recorded_by_doctor(
    db_path: Path, hermes_home: Path
) -> None:
    make_store(db_path, messages=80)
    pages = table_pages(db_path, "messages_fts_data", "leaf")
    overwrite(db_path, (pages[0] - 1) * PAGE, random.Random(3).randbytes(PAGE))
    doctor = cli(hermes_home, "--db", str(db_path), "doctor")
    assert doctor.returncode == 1 and "damage" in doctor.stdout
    assert "recorded" not in doctor.stdout and marker_of(db_path) is None


# ---------------------------------------------------------------------------------------------
# A restore onto a store whose -wal is damaged in the middle
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_restore_keeps_the_store_it_replaces_whole_when_its_wal_is_damaged(
    seed: int, db_path: Path, hermes_home: Path, tmp_path: Path
) -> None:
    """The commits after a damaged frame are invisible to SQLite: the copy of the replaced
    store a restore keeps must still hold them, for ``recover`` to fold."""
    store_of(db_path, "base", 1, 30, seed)
    snapshot = backup_state_db(db_path, tmp_path / "older.db")
    acknowledged = append_and_die(db_path, "base-0", 40)
    damage_a_middle_frame(db_path, random.Random(seed))

    report = restore_state_db(snapshot, db_path)

    assert report["previous_damaged"] is True
    previous = Path(report["previous_snapshot"])
    assert previous.exists() and "damaged" in previous.name
    kept = recovered_ids(previous, tmp_path / "recovered.db")
    assert set(acknowledged) <= kept
    with SessionDB(db_path, read_only=True) as db:
        assert len(db.get_messages("base-0")) == 30  # the snapshot's rows, as restored
    assert prune_snapshots(db_path, 0) == [str(previous)]
    assert not previous.exists() and not previous.with_name(previous.name + "-wal").exists()
