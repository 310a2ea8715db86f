"""Recover: healthy files copied whole, damaged files salvaged page by page, the source
never touched."""

from __future__ import annotations

import random
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import hermes_state_fileformat as ff
from hermes_state import (
    SCHEMA_VERSION,
    HermesStateError,
    SessionDB,
    StateDbInUseError,
    recover_state_db,
)
from state_helpers import (
    add_ledgers_and_outbox,
    append_and_die,
    append_until_corrupt,
    btree_pages,
    file_hashes,
    flip_byte,
    kill_restore_midway,
    overwrite_pages,
    point_freelist_at_live_pages,
    populate,
    process_holding,
    store_of,
    wal_frame_offset,
)

LEDGERS = ("runtime_epoch", "session_admissions", "worker_executions", "worker_receipts")


def count(path: Path, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]
    finally:
        conn.close()


@pytest.fixture
def store(db_path: Path) -> list[str]:
    with SessionDB(db_path) as db:
        ids = populate(db)
    add_ledgers_and_outbox(db_path, ids[0])
    return ids


def test_a_healthy_file_is_copied_whole_with_indexes_rebuilt(
    store: list[str], db_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "recovered.db"
    report = recover_state_db(db_path, out)

    for table in ("sessions", "messages", "session_model_usage", "delivery_obligations",
                  "gateway_routing"):
        entry = report["tables"][table]
        assert entry["found"] == entry["copied"] == count(db_path, table) > 0, table
        assert entry["verified"] and entry["lost"] == 0 and entry["lost_exact"]
        assert count(out, table) == count(db_path, table)
    assert report["complete"] and report["readable"]
    assert set(report["rebuilt"]) >= {"messages_fts", "schema_version"}
    assert report["checks"]["quick_check"] == ["ok"]
    assert set(report["checks"]["fts_integrity"].values()) == {None}

    # The ledgers are listed as excluded, with what the source holds, and not copied.
    for table in LEDGERS:
        assert report["excluded"][table]["found"] == 1
        assert "copied" not in report["excluded"][table]
        assert count(out, table) == 0

    conn = sqlite3.connect(out)
    try:
        hits = conn.execute(
            "SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH 'docker'"
        ).fetchone()[0]
        cjk = conn.execute(
            "SELECT COUNT(*) FROM messages_fts_cjk WHERE messages_fts_cjk MATCH '\"東京\"'"
        ).fetchone()[0]
        assert hits == cjk == count(db_path, "messages WHERE content LIKE '%docker%'")
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        conn.close()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    with SessionDB(out, read_only=True) as copy:
        assert copy.get_session(store[1])["parent_session_id"] == store[0]
        assert copy.get_messages(store[0], include_inactive=True)[0]["active"] is False


def test_a_deferred_index_is_filled_by_the_first_writable_open(
    store: list[str], db_path: Path, tmp_path: Path
) -> None:
    out = tmp_path / "recovered.db"
    report = recover_state_db(db_path, out, defer_index=True)
    assert report["complete"] and report["checks"]["fts_rebuild"] == "deferred"
    with SessionDB(out, read_only=True) as copy:
        assert copy.fts_status()["rebuild_high_water"] is not None
        assert copy.search_messages("docker")  # canonical rows answer meanwhile
    with SessionDB(out) as copy:
        copy.rebuild_fts()  # waits for the background rebuild the open started
        assert copy.fts_status()["rebuild_high_water"] is None
        assert set(copy.check_fts_integrity().values()) == {None}
    conn = sqlite3.connect(out)
    try:
        hits = conn.execute(
            "SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH 'docker'"
        ).fetchone()[0]
        assert hits == count(db_path, "messages WHERE content LIKE '%docker%'")
    finally:
        conn.close()


def test_inspect_only_changes_nothing(store: list[str], db_path: Path) -> None:
    before = file_hashes(db_path.parent)
    report = recover_state_db(db_path, inspect_only=True)
    assert file_hashes(db_path.parent) == before
    assert report["output"] is None and report["inspect_only"]
    assert report["tables"]["messages"]["found"] == count(db_path, "messages")
    assert report["tables"]["messages"]["copied"] is None


def test_committed_frames_still_in_the_wal_are_recovered(db_path: Path, tmp_path: Path) -> None:
    with SessionDB(db_path) as db:
        populate(db, sessions=1, messages=1)
    body = """
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("INSERT INTO sessions (id, source, started_at) VALUES ('only-in-wal', 'cli', 1)")
    """
    with process_holding(db_path, body):
        assert Path(str(db_path) + "-wal").stat().st_size > 0
        before = file_hashes(db_path.parent)
        report = recover_state_db(db_path, tmp_path / "out.db")
        assert file_hashes(db_path.parent) == before
        assert report["source_in_use"]  # the other process is named
    assert report["wal_frames_applied"] > 0
    assert report["tables"]["sessions"]["found"] == 2
    with SessionDB(tmp_path / "out.db", read_only=True) as copy:
        assert copy.get_session("only-in-wal") is not None


def big_store(db_path: Path, sessions: int = 10, per_session: int = 400) -> None:
    rng = random.Random(5)
    with SessionDB(db_path) as db:
        for s in range(sessions):
            db.create_session(f"s{s}", "cli")
            db.replace_messages(
                f"s{s}",
                [
                    {
                        "role": "user",
                        "content": f"message {s}-{i} " + "x" * rng.randint(10, 500)
                        + ("y" * 9000 if i % 97 == 0 else ""),  # some spill to overflow pages
                        "timestamp": 1000.0 + i,
                    }
                    for i in range(per_session)
                ],
            )


def rows(path: Path) -> dict[int, tuple]:
    conn = sqlite3.connect(path)
    try:
        return {
            r[0]: r
            for r in conn.execute(
                "SELECT id, session_id, role, content, timestamp, message_uid, active FROM messages"
            )
        }
    finally:
        conn.close()


def test_destroyed_pages_of_messages_lose_only_their_rows(db_path: Path, tmp_path: Path) -> None:
    big_store(db_path)
    pristine = rows(db_path)
    pages = btree_pages(db_path, "messages")
    interior = [p for p in pages["internal"] if p not in pages["root"]]
    middle = pages["leaf"][len(pages["leaf"]) // 4 : 3 * len(pages["leaf"]) // 4]
    victims = random.Random(1).sample(middle, 4) + interior[:1] + pages["overflow"][2:4]
    overwrite_pages(db_path, victims)
    with pytest.raises(sqlite3.DatabaseError):
        rows(db_path)  # SQLite itself stops at the first destroyed page

    out = tmp_path / "recovered.db"
    report = recover_state_db(db_path, out)
    entry = report["tables"]["messages"]
    salvaged = rows(out)
    assert entry["found"] == entry["copied"] == len(salvaged)
    assert len(salvaged) > 0.9 * len(pristine)
    assert all(pristine[i] == row for i, row in salvaged.items())  # nothing invented or garbled
    actually_lost = len(pristine) - len(salvaged)
    assert 0 < actually_lost <= entry["lost"]  # the estimate is an upper bound...
    assert entry["lost"] - actually_lost < 0.01 * len(pristine)  # ...and a tight one here
    assert not entry["lost_exact"] and entry["lost_basis"]
    assert entry["method"] in ("pages", "sql+pages")
    # Destroyed pages, and leaves whose cells spill into destroyed overflow pages.
    assert set(entry["unreadable_pages"]) - set(victims) <= set(pages["leaf"])
    assert report["tables"]["sessions"]["lost"] == 0
    assert report["readable"] and not report["complete"]
    assert report["checks"]["quick_check"] == ["ok"]
    conn = sqlite3.connect(out)
    try:
        found = conn.execute(
            "SELECT COUNT(*) FROM messages_fts WHERE messages_fts MATCH 'message'"
        ).fetchone()[0]
        assert found == len(salvaged)
    finally:
        conn.close()


def test_a_destroyed_root_page_is_bypassed_through_the_unreferenced_leaves(
    db_path: Path, tmp_path: Path
) -> None:
    big_store(db_path, sessions=4, per_session=300)
    pristine = rows(db_path)
    overwrite_pages(db_path, btree_pages(db_path, "messages")["root"])
    report = recover_state_db(db_path, tmp_path / "out.db")
    entry = report["tables"]["messages"]
    assert entry["found"] == len(pristine) and entry["lost"] == 0
    assert entry["unreferenced_pages_read"] > 0
    assert rows(tmp_path / "out.db") == pristine


def test_a_destroyed_schema_page_still_yields_rows_by_their_shape(
    db_path: Path, tmp_path: Path
) -> None:
    big_store(db_path, sessions=3, per_session=100)
    pristine = rows(db_path)
    overwrite_pages(db_path, [1])
    report = recover_state_db(db_path, tmp_path / "out.db")
    assert report["schema_read_by"] == "none"
    assert report["tables"]["sessions"]["found"] == 3
    assert report["tables"]["messages"]["found"] == len(pristine)
    assert report["tables"]["messages"]["lost"] is None  # unknowable without the schema
    assert "schema_version" not in report["tables"]
    assert rows(tmp_path / "out.db") == pristine


def test_messages_whose_session_row_was_lost_keep_a_placeholder_session(
    db_path: Path, tmp_path: Path
) -> None:
    big_store(db_path, sessions=2, per_session=50)
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("DELETE FROM sessions WHERE id = 's1'")
    conn.commit()
    conn.close()
    report = recover_state_db(db_path, tmp_path / "out.db")
    assert report["placeholder_sessions"] == ["s1"]
    assert report["tables"]["sessions"]["verified"]
    with SessionDB(tmp_path / "out.db", read_only=True) as copy:
        placeholder = copy.get_session("s1")
        assert placeholder["source"] == "recovered" and placeholder["message_count"] == 50


def test_a_file_with_nothing_readable_is_reported_unreadable(tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(random.Random(3).randbytes(64 * 1024))
    report = recover_state_db(junk, inspect_only=True)
    assert report["readable"] is False and report["rows_found"] == 0


def test_an_old_schema_file_is_recovered_into_the_current_schema(tmp_path: Path) -> None:
    old = tmp_path / "v1.db"
    conn = sqlite3.connect(old)
    conn.executescript(
        """
        CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT NOT NULL, model TEXT,
            started_at REAL NOT NULL, title TEXT);
        CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id TEXT NOT NULL,
            role TEXT NOT NULL, content TEXT, timestamp REAL NOT NULL);
        INSERT INTO sessions VALUES ('a', 'cli', NULL, 1, 'Same'), ('b', 'cli', NULL, 2, 'Same');
        INSERT INTO messages (session_id, role, content, timestamp) VALUES ('a', 'user', 'hi', 1);
        """
    )
    conn.close()
    report = recover_state_db(old, tmp_path / "out.db")
    assert report["schema_version"] == 1
    with SessionDB(tmp_path / "out.db", read_only=True) as copy:
        message = copy.get_messages("a")[0]
        assert message["content"] == "hi" and len(message["message_uid"]) == 32
        assert {copy.get_session_title("a"), copy.get_session_title("b")} == {"Same", "Same #2"}


def test_the_output_never_replaces_an_existing_file_or_the_source(
    store: list[str], db_path: Path, tmp_path: Path
) -> None:
    existing = tmp_path / "taken.db"
    existing.write_bytes(b"keep me")
    with pytest.raises(HermesStateError, match="already exists"):
        recover_state_db(db_path, existing)
    with pytest.raises(HermesStateError, match="overwrite the source"):
        recover_state_db(db_path, db_path)
    assert existing.read_bytes() == b"keep me"


def test_recover_refuses_a_source_this_process_has_open(db: SessionDB, db_path: Path) -> None:
    db.create_session("s", "cli")
    with pytest.raises(StateDbInUseError):
        recover_state_db(db_path, inspect_only=True)


def test_fold_wal_applies_only_committed_valid_frames(db_path: Path, tmp_path: Path) -> None:
    """The WAL reader against SQLite's own reading of the same files."""
    body = """
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA wal_autocheckpoint = 0")
    conn.execute("CREATE TABLE IF NOT EXISTS t (x)")
    for i in range(50):
        conn.execute("INSERT INTO t VALUES (?)", (i,))
    """
    with process_holding(db_path, body):
        copy = tmp_path / "copy"
        copy.mkdir()
        shutil.copy(db_path, copy / "image.db")
        wal = Path(str(db_path) + "-wal")
        shutil.copy(wal, copy / "image.db-wal")
        expected = sqlite3.connect(copy / "image.db").execute("SELECT COUNT(*) FROM t").fetchone()
        (copy / "image.db-wal").unlink()
        (copy / "image.db-shm").unlink(missing_ok=True)
        folded = ff.fold_wal(wal, copy / "image.db")
    assert folded.frames > 0 and folded.page_size == 4096
    conn = sqlite3.connect(f"file:{copy / 'image.db'}?immutable=1", uri=True)
    assert conn.execute("SELECT COUNT(*) FROM t").fetchone() == expected == (50,)


def test_a_table_this_schema_does_not_know_is_copied_with_its_own_definition(
    store: list[str], db_path: Path, tmp_path: Path
) -> None:
    conn = sqlite3.connect(db_path)
    conn.executescript(
        "CREATE TABLE plugin_notes (id INTEGER PRIMARY KEY, note TEXT);"
        "INSERT INTO plugin_notes (note) VALUES ('a'), ('b');"
    )
    conn.close()
    report = recover_state_db(db_path, tmp_path / "out.db")
    assert report["tables"]["plugin_notes"]["unknown_table"]
    assert report["tables"]["plugin_notes"]["copied"] == 2
    assert count(tmp_path / "out.db", "plugin_notes") == 2


def test_a_row_of_a_table_without_rowids_the_output_refuses_is_counted_not_fatal(
    store: list[str], db_path: Path, tmp_path: Path
) -> None:
    conn = sqlite3.connect(db_path)
    conn.executescript(
        "CREATE TABLE extra (k TEXT PRIMARY KEY, v INTEGER CHECK (v > 0)) WITHOUT ROWID;"
        "PRAGMA ignore_check_constraints = ON;"
        "INSERT INTO extra VALUES ('bad', -1), ('good', 1);"
    )
    conn.close()
    report = recover_state_db(db_path, tmp_path / "out.db")
    extra = report["tables"]["extra"]
    assert (extra["copied"], extra["rejected"]) == (1, 1)
    assert count(tmp_path / "out.db", "extra") == 1
    assert count(tmp_path / "out.db", "messages") == count(db_path, "messages")


# --- interrupted transactions and damaged sidecars --------------------------------------------

SEEDS = [1, 2, 3]


def message_rows(path: Path) -> dict[int, tuple]:
    """id → (session_id, role, content) of every message of a readable store (immutable, so
    nothing beside the file is created or changed)."""
    conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return {r[0]: r[1:] for r in conn.execute(
            "SELECT id, session_id, role, content FROM messages")}
    finally:
        conn.close()


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_recover_reads_the_committed_state_behind_a_killed_restore(
    seed: int, hermes_home: Path, db_path: Path, tmp_path: Path
) -> None:
    store_of(db_path, "live", 3, 700, seed)
    store_of(tmp_path / "snapshot.db", "snap", 3, 700, seed + 100)
    committed = message_rows(db_path)
    kill_restore_midway(hermes_home, db_path, tmp_path / "snapshot.db")
    before = file_hashes(hermes_home)

    out = tmp_path / "recovered.db"
    report = recover_state_db(db_path, out)
    assert file_hashes(hermes_home) == before  # the source and its journal are untouched
    assert message_rows(out) == committed  # every committed row, and not one of the snapshot's
    with SessionDB(out, read_only=True) as copy:
        assert {s["id"] for s in copy.search_sessions(limit=-1)} == {f"live-{n}" for n in range(3)}
    assert report["journal"]["rolled_back_pages"] > 10
    assert not report["journal"]["damaged_records"] and not report["journal"]["header_damaged"]
    assert any("hot rollback journal" in note for note in report["notes"])
    entry = report["tables"]["messages"]
    assert entry["found"] == entry["copied"] == len(committed) and entry["lost"] == 0
    assert report["complete"] and report["verified"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [2, 4, 8])
def test_recover_keeps_every_row_the_main_file_holds_when_the_wal_reused_live_pages(
    seed: int, db_path: Path, tmp_path: Path
) -> None:
    store_of(db_path, "live", 6, 400, seed)
    with SessionDB(db_path) as db:
        db.delete_session("live-5")  # its pages go to the freelist
    point_freelist_at_live_pages(db_path, "messages", seed)
    acknowledged = append_until_corrupt(db_path, "live-0")
    assert db_path.with_name("state.db-wal").stat().st_size > 0  # quarantine kept the -wal

    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copyfile(db_path, alone / "state.db")  # the main file without its -wal
    recover_state_db(alone / "state.db", tmp_path / "main-file.db")
    held = message_rows(tmp_path / "main-file.db")

    out = tmp_path / "recovered.db"
    report = recover_state_db(db_path, out)
    salvaged = message_rows(out)
    assert set(acknowledged) <= set(salvaged)  # every acknowledged append...
    assert set(held) <= set(salvaged)  # ...and every row the main file alone holds
    entry = report["tables"]["messages"]
    only = entry["only_in"]["file"]
    assert only["found"] == only["copied"] > 0 and set(only["ids"]) <= set(held)
    assert all(salvaged[i] == held[i] for i in only["ids"])
    assert entry["sources"]["file"] == only["copied"]
    assert entry["lost"] is None and not entry["lost_exact"] and not report["complete"]
    assert any("only the main file holds" in note for note in report["notes"])
    # Impossible rowids (pages of other tables read as messages) are reported, never copied.
    conn = sqlite3.connect(f"file:{out}?immutable=1", uri=True)
    sequence = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'messages'").fetchone()
    conn.close()
    assert all(0 < i <= sequence[0] for i in salvaged)
    # What was lost is shown as unknown, not as an exact 0, and a count of the source that
    # disagrees with its rows is said plainly, on the command line too.
    shown = subprocess.run(
        [sys.executable, "-m", "hermes_state_cli", "sessions", "recover", "--input",
         str(db_path), "--inspect-only"], capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    line = next(x for x in shown.stdout.splitlines() if x.startswith("messages"))
    assert line.split()[3] == "?" and "only the main file holds" in shown.stdout
    if not entry.get("verified", True):
        assert report["unverified"] and not report["verified"] and report["output_verified"]
        assert "! not verified: messages: SQLite counts" in shown.stdout
        assert "do not agree" in shown.stderr


@pytest.mark.parametrize("seed", SEEDS)
def test_recover_salvages_the_commits_after_a_damaged_wal_frame(
    seed: int, db_path: Path, tmp_path: Path
) -> None:
    store_of(db_path, "base", 1, 150, seed)
    before = message_rows(db_path)
    acknowledged = append_and_die(db_path, "base-0", 20)
    wal = db_path.with_name("state.db-wal")
    rng = random.Random(seed)
    frame = rng.randrange(2, 12)
    flip_byte(wal, wal_frame_offset(wal, frame) + 24 + rng.randrange(4096))

    out = tmp_path / "recovered.db"
    report = recover_state_db(db_path, out)
    salvaged = message_rows(out)
    assert set(before) | set(acknowledged) == set(salvaged)
    assert [salvaged[i][2] for i in acknowledged] == [
        f"acked {n} " + "y" * (100 + 37 * n) for n in range(20)]
    damage = report["wal"]
    assert damage["damaged_frames"] == [frame] and damage["readable_by_sqlite"] < frame
    assert damage["later_commits"] >= 19 and damage["rows_after_damage"]["messages"] >= 19
    assert any("the -wal is damaged at frame" in note for note in report["notes"])
    entry = report["tables"]["messages"]
    if not damage["unreplaced_pages"]:  # the damaged frame's page was rewritten later
        assert entry["lost"] == 0 and entry["lost_exact"] and report["complete"]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_damaged_journal_costs_only_the_pages_of_its_damaged_records(
    seed: int, hermes_home: Path, db_path: Path, tmp_path: Path
) -> None:
    store_of(db_path, "live", 3, 700, seed)
    store_of(tmp_path / "snapshot.db", "snap", 3, 700, seed + 100)
    committed = message_rows(db_path)
    pristine = tmp_path / "pristine.db"
    shutil.copyfile(db_path, pristine)
    kill_restore_midway(hermes_home, db_path, tmp_path / "snapshot.db")
    journal = db_path.with_name("state.db-journal")
    records = ff.read_journal(journal).records
    leaves = set(btree_pages(pristine, "messages")["leaf"])
    index, (page, at) = next((n, r) for n, r in enumerate(records)
                             if r[0] in leaves and n > len(records) // 4)
    flip_byte(journal, at + 4096 - 200)  # a byte the record's checksum samples

    out = tmp_path / "recovered.db"
    report = recover_state_db(db_path, out)
    assert report["journal"]["damaged_records"] == [{"record": index, "page": page}]
    assert any(f"pages {page}" in note and "fail their checksum" in note
               for note in report["notes"])
    entry = report["tables"]["messages"]
    assert entry["lost"] is None and not entry["lost_exact"] and not report["complete"]
    salvaged = message_rows(out)
    with ff.DatabaseImage(pristine) as image:
        on_page = ff.table_rowids(image, page)  # what the damaged record would have restored
    assert set(committed) - set(salvaged) <= on_page  # only that page's rows can be missing
    assert all(salvaged[i] == committed[i] for i in set(committed) - on_page)
    # What the unrestored page holds comes last, and every row only it gave is named.
    unrestored = entry.get("only_in", {}).get("unrestored-journal-pages", {"ids": []})
    assert set(salvaged) - set(committed) <= set(unrestored["ids"])
    assert all(salvaged[i] == committed[i] for i in set(salvaged) - set(unrestored["ids"]))


def last_commit_frames(wal: Path, page_size: int = 4096) -> list[tuple[int, int]]:
    """(frame number, page) of the frames of the last commit of a -wal, read from its frame
    headers (page number at offset 0, database size at offset 4: non-zero on a commit)."""
    frames = []
    data = wal.read_bytes()
    for number in range(1, (len(data) - 32) // (24 + page_size) + 1):
        at = wal_frame_offset(wal, number, page_size)
        frames.append((number, int.from_bytes(data[at : at + 4], "big"),
                       int.from_bytes(data[at + 4 : at + 8], "big")))
    commits = [n for n, _, size in frames if size]
    start = commits[-2] if len(commits) > 1 else 0
    return [(n, pgno) for n, pgno, _ in frames[start : commits[-1]]]


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_a_row_only_a_damaged_frame_holds_is_kept_last_and_named(
    seed: int, db_path: Path, tmp_path: Path
) -> None:
    store_of(db_path, "base", 1, 120, seed)
    acknowledged = append_and_die(db_path, "base-0", 10 + seed)
    texts = [f"acked {n} " + "y" * (100 + 37 * n) for n in range(len(acknowledged))]
    wal = db_path.with_name("state.db-wal")
    # A frame of the last commit, not its commit frame (damage there uncommits the whole
    # transaction), that holds the messages leaf with the last message (its text is in the
    # page): damage a byte of the page's free space, so its content still reads, but no
    # checksum vouches for it. When the leaf is the commit frame (it is the highest page
    # the commit wrote), one more append makes another last commit.
    for _ in range(40):
        data = wal.read_bytes()
        text = texts[-1].split(" y")[0].encode()
        target = next(((number, pgno, page) for number, pgno in last_commit_frames(wal)[:-1]
                       for page in [data[wal_frame_offset(wal, number) + 24:][:4096]]
                       if page[0] == 0x0D and acknowledged[-1] in leaf_rowids(page)
                       and text in page), None)
        if target is not None:
            break
        acknowledged += append_and_die(db_path, "base-0", 1)
        texts.append("acked 0 " + "y" * 100)
    else:
        raise AssertionError("no frame of the last commits holds the last message")
    number, pgno, page = target
    free = 8 + 2 * int.from_bytes(page[3:5], "big")
    assert free < int.from_bytes(page[5:7], "big")
    flip_byte(wal, wal_frame_offset(wal, number) + 24 + free)

    out = tmp_path / "recovered.db"
    report = recover_state_db(db_path, out)
    salvaged = message_rows(out)
    assert [salvaged[i][2] for i in acknowledged] == texts
    assert report["wal"]["damaged_frames"] == [number]
    assert report["wal"]["unreplaced_pages"] == [pgno]
    entry = report["tables"]["messages"]
    assert acknowledged[-1] in entry["only_in"]["damaged-wal-frames"]["ids"]
    assert entry["lost"] is None and not report["complete"]
    assert any("damaged -wal frames holds" in note and "check them" in note
               for note in report["notes"])


def leaf_rowids(page: bytes) -> set[int]:
    """The rowids of a table leaf page's cells (payload size varint, then the rowid varint)."""
    rowids = set()
    for i in range(int.from_bytes(page[3:5], "big")):
        at = int.from_bytes(page[8 + 2 * i : 10 + 2 * i], "big")
        for _ in range(2):
            value, start = 0, at
            while page[at] & 0x80:
                value, at = (value << 7) | (page[at] & 0x7F), at + 1
            value, at = (value << 7) | page[at], at + 1
            assert at - start <= 8
        rowids.add(value)
    return rowids
