"""The file-format reader's sidecars against SQLite's own reading of the same files: a hot
rollback journal left by a killed restore, and -wal files written by SessionDB in other
processes (whole, reset, torn, damaged)."""

from __future__ import annotations

import random
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

import hermes_state_fileformat as ff
from hermes_state import SessionDB
from state_helpers import (
    append_and_die,
    flip_byte,
    kill_restore_midway,
    store_of,
    wal_frame_offset,
)

SEEDS = [1, 2, 3]
PAGE = 4096


def pages(path: Path) -> list[bytes]:
    data = path.read_bytes()
    return [data[i : i + PAGE] for i in range(0, len(data), PAGE)]


def rolled_back_by_sqlite(db: Path, journal: Path, where: Path) -> Path:
    """The main file as SQLite itself rolls the journal back (a plain open and a read)."""
    where.mkdir()
    shutil.copyfile(db, where / "state.db")
    shutil.copyfile(journal, where / "state.db-journal")
    conn = sqlite3.connect(where / "state.db")
    conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
    conn.close()
    assert not (where / "state.db-journal").exists()
    return where / "state.db"


@pytest.fixture
def torn(hermes_home: Path, db_path: Path, tmp_path: Path, request: pytest.FixtureRequest
         ) -> tuple[Path, Path, bytes]:
    """A store (its bytes before) left half-restored by a killed ``hermes-state restore``."""
    seed = request.param
    store_of(db_path, "live", 3, 700, seed)
    store_of(tmp_path / "snapshot.db", "snap", 3, 700, seed + 100)
    with SessionDB(db_path):
        pass  # a writable open and close: the store is checkpointed, as a restore finds it
    before = db_path.read_bytes()
    kill_restore_midway(hermes_home, db_path, tmp_path / "snapshot.db")
    return db_path, db_path.with_name("state.db-journal"), before


@pytest.mark.slow
@pytest.mark.parametrize("torn", SEEDS, indirect=True)
def test_rolling_back_a_killed_restores_journal_matches_sqlite(
    torn: tuple[Path, Path, bytes], tmp_path: Path
) -> None:
    db, journal, before = torn
    torn_pages = pages(db)
    changed = [n for n, (a, b) in enumerate(zip(torn_pages, pages_of(before)), 1) if a != b]
    assert len(changed) > 10  # the snapshot's pages really are in the live file

    scan = ff.read_journal(journal)
    assert scan.hot and not scan.damaged and not scan.header_damaged
    assert scan.page_size == PAGE and scan.initial_pages == len(before) // PAGE

    copy = tmp_path / "copy.db"
    shutil.copyfile(db, copy)
    ff.roll_back_journal(journal, copy)
    expected = rolled_back_by_sqlite(db, journal, tmp_path / "sqlite")
    assert copy.read_bytes() == expected.read_bytes()
    # What the rollback restores is the store as it was, but for page 1: the restore's
    # switch to rollback-journal mode, committed before the copy began, changed its header.
    assert pages(copy)[1:] == pages_of(before)[1:]


def pages_of(data: bytes) -> list[bytes]:
    return [data[i : i + PAGE] for i in range(0, len(data), PAGE)]


@pytest.mark.slow
@pytest.mark.parametrize("torn", SEEDS, indirect=True)
def test_a_damaged_journal_record_is_reported_and_every_record_that_verifies_rolled_back(
    torn: tuple[Path, Path, bytes], tmp_path: Path
) -> None:
    db, journal, before = torn
    expected = rolled_back_by_sqlite(db, journal, tmp_path / "intact")
    scan = ff.read_journal(journal)
    victim = random.Random(len(scan.records)).randrange(len(scan.records) // 4,
                                                        len(scan.records) // 2)
    pgno, at = scan.records[victim]
    flip_byte(journal, at + PAGE - 200)  # a byte the record's checksum samples

    damaged = ff.read_journal(journal)
    assert damaged.damaged == [(victim, pgno)]
    assert len(damaged.records) == len(scan.records) - 1
    copy = tmp_path / "copy.db"
    shutil.copyfile(db, copy)
    ff.roll_back_journal(journal, copy)
    ours, theirs = pages(copy), pages(expected)
    assert [n for n, (a, b) in enumerate(zip(ours, theirs), 1) if a != b] in ([], [pgno])
    # SQLite's own rollback stops at the damaged record and leaves the later ones undone.
    stopped = pages(rolled_back_by_sqlite(db, journal, tmp_path / "sqlite"))
    later = {p for p, _ in scan.records[victim + 1 :]}
    assert any(stopped[p - 1] != theirs[p - 1] for p in later)


def test_a_missing_empty_or_finished_journal_is_not_hot(tmp_path: Path) -> None:
    journal = tmp_path / "state.db-journal"
    assert not ff.read_journal(journal).hot
    journal.write_bytes(b"")
    assert not ff.read_journal(journal).hot
    journal.write_bytes(bytes(28) + b"\xff" * 4000)  # PERSIST mode's zeroed header
    assert not ff.read_journal(journal).hot
    journal.write_bytes(b"\x01" + bytes(600))
    scan = ff.read_journal(journal)
    assert scan.hot and scan.header_damaged and not scan.records


# --- the WAL ----------------------------------------------------------------------------------


def sqlite_reads(db: Path, wal: Path, where: Path) -> bytes:
    """The database SQLite reads from ``db`` and ``wal``, checkpointed into a copy."""
    where.mkdir()
    shutil.copyfile(db, where / "state.db")
    shutil.copyfile(wal, where / "state.db-wal")
    conn = sqlite3.connect(where / "state.db")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return (where / "state.db").read_bytes()


def folded(db: Path, wal: Path, where: Path, **kwargs: bool) -> bytes:
    shutil.copyfile(db, where)
    ff.fold_wal(wal, where, **kwargs)
    return where.read_bytes()


@pytest.fixture
def committed_wal(db_path: Path, request: pytest.FixtureRequest) -> tuple[Path, list[int]]:
    """A store whose -wal holds 20 acknowledged appends of a process that died without
    closing; returns the -wal and the ids."""
    store_of(db_path, "base", 1, 150, request.param)
    ids = append_and_die(db_path, "base-0", 20)
    return db_path.with_name("state.db-wal"), ids


@pytest.mark.parametrize("committed_wal", SEEDS, indirect=True)
def test_an_intact_wal_is_read_as_sqlite_reads_it(
    committed_wal: tuple[Path, list[int]], db_path: Path, tmp_path: Path
) -> None:
    wal, _ = committed_wal
    scan = ff.scan_wal(wal)
    assert not scan.problem and scan.readable == scan.frames > 20 and not scan.torn_frames
    ours = folded(db_path, wal, tmp_path / "ours.db")
    assert ours == sqlite_reads(db_path, wal, tmp_path / "sqlite")


@pytest.mark.parametrize("committed_wal", SEEDS, indirect=True)
def test_a_damaged_early_frame_hides_later_commits_from_sqlite_but_not_from_the_scan(
    committed_wal: tuple[Path, list[int]], db_path: Path, tmp_path: Path
) -> None:
    wal, ids = committed_wal
    intact = sqlite_reads(db_path, wal, tmp_path / "intact")
    whole = ff.scan_wal(wal)
    rng = random.Random(len(ids) + whole.frames)
    frame = rng.randrange(2, 12)
    flip_byte(wal, wal_frame_offset(wal, frame) + 24 + rng.randrange(PAGE))

    scan = ff.scan_wal(wal)
    assert scan.problem and scan.damaged == [frame]
    assert scan.readable < frame and scan.frames == whole.frames
    assert scan.later_commits >= 19 and scan.later_frames >= whole.frames - frame - 1
    rows = ff.wal_damage_rows(db_path, wal, scan)
    assert rows.get("messages", 0) >= 19
    # SQLite itself now reads none of the commits after the damaged frame...
    lost = sqlite_reads(db_path, wal, tmp_path / "sqlite")
    conn = sqlite3.connect(tmp_path / "sqlite" / "state.db")
    assert conn.execute("SELECT COUNT(*) FROM messages WHERE id >= ?", (ids[1],)).fetchone() == (0,)
    conn.close()
    assert lost != intact
    # ...the salvage folds them: the database as the intact WAL gave it, but for the page of
    # the damaged frame where no later commit rewrote it.
    ours = pages_of(folded(db_path, wal, tmp_path / "ours.db"))
    differ = [n for n, (a, b) in enumerate(zip(ours, pages_of(intact)), 1) if a != b]
    _, _, unreplaced = scan.plan(salvage=True)
    assert len(ours) == len(pages_of(intact)) and differ == unreplaced


# Bits of the -wal header: of the checkpoint sequence number (the header's checksum fails), of
# the magic number, the byte-order one (another valid magic, whose checksum fails) or another
# (SQLite takes the file for no WAL at all), and of the page size (no WAL either). Either way
# SQLite ignores every frame.
HEADER_BITS = {"sequence": (13, 0x10), "magic": (0, 0x10), "byte order": (3, 0x01),
               "page size": (10, 0x10)}


@pytest.mark.parametrize("field", sorted(HEADER_BITS))
def test_a_damaged_header_is_frame_zero_of_the_damage(
    db_path: Path, tmp_path: Path, field: str
) -> None:
    store_of(db_path, "base", 1, 60, 4)
    append_and_die(db_path, "base-0", 5)
    wal = db_path.with_name("state.db-wal")
    intact = sqlite_reads(db_path, wal, tmp_path / "intact")
    flip_byte(wal, *HEADER_BITS[field])
    assert sqlite_reads(db_path, wal, tmp_path / "sqlite") != intact
    scan = ff.scan_wal(wal)
    assert scan.damaged == [0] and scan.readable == 0 and scan.later_commits >= 5
    assert folded(db_path, wal, tmp_path / "ours.db") == intact


@pytest.mark.parametrize("seed", SEEDS)
def test_frames_of_an_earlier_generation_are_stale_not_damage(
    seed: int, db_path: Path, tmp_path: Path
) -> None:
    store_of(db_path, "base", 1, 40, seed)
    # SessionDB checkpoints every 50 writes; the next writer resets the WAL and writes over
    # its start, leaving frames of the earlier generation (old salts) after the new ones.
    append_and_die(db_path, "base-0", 70)
    wal = db_path.with_name("state.db-wal")
    scan = ff.scan_wal(wal)
    assert not scan.problem and scan.stale_frames > 10 and scan.readable > 10
    assert scan.readable + scan.stale_frames + scan.torn_frames == scan.frames
    assert folded(db_path, wal, tmp_path / "ours.db") == sqlite_reads(db_path, wal,
                                                                      tmp_path / "sqlite")


def test_an_uncommitted_torn_tail_is_no_problem(db_path: Path, tmp_path: Path) -> None:
    store_of(db_path, "base", 1, 40, 6)
    code = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint = 0")
conn.execute("PRAGMA cache_size = 10")  # the big transaction spills frames before it commits
conn.execute("INSERT INTO state_meta VALUES ('committed', 'v')")
conn.execute("BEGIN")
for i in range(300):
    conn.execute("INSERT INTO state_meta VALUES (?, ?)", (f"never-{i}", "v" * 3000))
os._exit(0)
"""
    subprocess.run([sys.executable, "-c", code, str(db_path)], check=True, timeout=30)
    wal = db_path.with_name("state.db-wal")
    scan = ff.scan_wal(wal)
    assert scan.torn_frames > 50 and not scan.problem and scan.readable
    flip_byte(wal, wal_frame_offset(wal, scan.readable + 3) + 100)  # damage in the torn tail
    scan = ff.scan_wal(wal)
    assert not scan.problem and scan.torn_frames > 50
    assert folded(db_path, wal, tmp_path / "ours.db") == sqlite_reads(db_path, wal,
                                                                      tmp_path / "sqlite")
