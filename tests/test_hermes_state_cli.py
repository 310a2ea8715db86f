"""The hermes-state command line, run end to end in a subprocess against a temporary home."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conftest import file_state, leave_committed_wal
from hermes_state import SessionDB
from state_helpers import (
    append_and_die,
    btree_pages,
    file_hashes,
    flip_byte,
    kill_restore_midway,
    overwrite_pages,
    populate,
    sha256,
    store_of,
    wal_frame_offset,
)


def cli(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HERMES_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "hermes_state_cli", *args],
        env=env, input=stdin, capture_output=True, text=True, timeout=120,
    )


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(result.stdout)


@pytest.fixture
def store(db_path: Path) -> list[str]:
    with SessionDB(db_path) as db:
        return populate(db)


def test_list_show_and_stats_read_the_store(store: list[str], hermes_home: Path) -> None:
    listed = cli(hermes_home, "sessions", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [(r["id"], r["_lineage_root_id"]) for r in as_json(listed)] == [(store[2], store[0])]

    shown = cli(hermes_home, "--json", "sessions", "show", "sess-1")
    assert shown.returncode == 0
    assert as_json(shown)["title"] == "Title 1" and as_json(shown)["messages"]
    text = cli(hermes_home, "sessions", "show", "Title 2")
    assert "question 2.1" in text.stdout and "question 2.0" not in text.stdout  # archived

    stats = as_json(cli(hermes_home, "sessions", "stats", "--json"))
    assert stats["sessions"] == 3
    assert {r["source"] for r in stats["by_source"]} == {"cli", "telegram"}
    assert stats["by_model"][0]["model"] == "model-a"


def test_search_finds_messages_with_filters_and_never_fails_on_odd_text(
    store: list[str], hermes_home: Path
) -> None:
    hits = as_json(cli(hermes_home, "sessions", "search", "docker", "--json"))
    assert hits and all(">>>docker<<<" in h["snippet"] for h in hits)
    assert {h["role"] for h in hits} == {"user"}
    cjk = as_json(cli(hermes_home, "sessions", "search", "タワー", "--source", "telegram",
                      "--json"))
    assert cjk and {h["source"] for h in cjk} == {"telegram"}
    assert as_json(cli(hermes_home, "sessions", "search", "output", "--role", "tool",
                       "--limit", "2", "--json"))[0]["role"] == "tool"
    for odd in ('"unbalanced', "NEAR(a b)", "col:term", "50%", "***"):
        result = cli(hermes_home, "sessions", "search", odd)
        assert result.returncode == 0, result.stderr
    text = cli(hermes_home, "sessions", "search", "question")
    assert text.returncode == 0 and "sess-" in text.stdout


def test_search_sorts_by_time_and_includes_rewound_rows_when_asked(
    db_path: Path, hermes_home: Path
) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s1", "cli")
        ids = [db.append_message("s1", "user", f"kiwi number {n}", timestamp=100.0 + n)
               for n in range(4)]
    with sqlite3.connect(db_path) as raw:  # /undo takes the last row back
        raw.execute("UPDATE messages SET active = 0 WHERE id = ?", (ids[-1],))
        raw.execute("UPDATE sessions SET rewind_count = 1 WHERE id = 's1'")
    raw.close()

    def search(*args: str) -> list[int]:
        result = cli(hermes_home, "sessions", "search", "kiwi", "--json", *args)
        assert result.returncode == 0, result.stderr
        return [hit["id"] for hit in as_json(result)]

    assert search("--sort", "newest") == ids[2::-1]
    assert search("--sort", "oldest", "--limit", "2") == ids[:2]
    assert search("--sort", "newest", "--include-inactive") == ids[::-1]
    assert sorted(search()) == ids[:3]  # relevance: equal scores, ties by id
    assert search() == ids[:3]
    wrong = cli(hermes_home, "sessions", "search", "kiwi", "--sort", "sideways")
    assert wrong.returncode != 0 and "--sort" in wrong.stderr


def test_doctor_on_a_fresh_home_reports_and_succeeds_without_creating_anything(
    hermes_home: Path,
) -> None:
    result = cli(hermes_home, "doctor")
    assert result.returncode == 0, result.stderr
    assert "no store yet" in result.stdout and "SQLite: " in result.stdout
    assert list(hermes_home.iterdir()) == []


def test_reading_a_missing_store_fails_with_guidance_and_creates_nothing(
    hermes_home: Path,
) -> None:
    result = cli(hermes_home, "sessions", "list")
    assert result.returncode == 1
    assert "sessions recover" in result.stderr and "gateway" not in result.stderr
    assert list(hermes_home.iterdir()) == []


def test_export_then_import_into_another_store(store: list[str], hermes_home: Path,
                                               tmp_path: Path) -> None:
    export = tmp_path / "export.jsonl"
    result = cli(hermes_home, "sessions", "export", "--output", str(export))
    assert result.returncode == 0, result.stderr
    assert json.loads(export.read_text().splitlines()[0])["kind"] == "header"
    assert cli(hermes_home, "sessions", "export", "--output", str(export)).returncode == 1

    other = tmp_path / "other.db"
    first = cli(hermes_home, "--db", str(other), "sessions", "import", str(export), "--json")
    assert first.returncode == 0, first.stderr
    assert as_json(first)["imported"] == store
    again = cli(hermes_home, "--db", str(other), "sessions", "import", str(export), "--json")
    assert again.returncode == 0 and as_json(again)["skipped"] == store

    as_list = cli(hermes_home, "sessions", "export", "sess-1", "--lineage", "--format", "json")
    sessions = json.loads(as_list.stdout)
    assert [s["id"] for s in sessions] == store
    sessions[0]["messages"].append({"role": "user", "content": "changed"})
    conflict = cli(hermes_home, "--db", str(other), "sessions", "import", "-", "--json",
                   stdin=json.dumps(sessions))
    assert conflict.returncode == 1
    assert [e["session_id"] for e in as_json(conflict)["errors"]] == [store[0]]


def test_prune_and_delete(store: list[str], hermes_home: Path) -> None:
    pruned = cli(hermes_home, "sessions", "prune", "--older-than-days", "0", "--json")
    assert pruned.returncode == 0 and as_json(pruned)["pruned"] == 0  # the chain is live
    deleted = cli(hermes_home, "sessions", "delete", store[2], "--yes", "--json")
    assert deleted.returncode == 0 and as_json(deleted)["deleted"] is True
    assert cli(hermes_home, "sessions", "delete", "no-such-session").returncode == 1


def test_prune_narrows_by_every_filter_of_the_vocabulary_it_is_given(
    hermes_home: Path, db_path: Path
) -> None:
    with SessionDB(db_path) as db:
        for sid, model, messages, title in [("a", "gpt-4o", 3, "Deploy notes"),
                                            ("b", "gpt-4o", 1, "deploy retry"),
                                            ("c", "claude", 3, "Deploy again"),
                                            ("d", "gpt-4o-mini", 5, None)]:
            db.create_session(sid, "cli", model=model, user_id=f"user-{sid}")
            for n in range(messages):
                db.append_message(sid, "user", f"m{n}")
            if title:
                db.set_session_title(sid, title)
            db.end_session(sid, "user_exit")
        db.set_session_archived("d", True)
    conn = sqlite3.connect(db_path)  # started 2020-01-01 .. 2020-01-04 (UTC), one a day
    with conn:
        for day, sid in enumerate("abcd"):
            conn.execute("UPDATE sessions SET started_at = ? WHERE id = ?",
                         (1577836800 + day * 86400, sid))
    conn.close()

    def prune(*flags: str) -> list[str]:
        listed = cli(hermes_home, "--json", "sessions", "prune", "--dry-run", *flags)
        assert listed.returncode == 0, listed.stderr
        return [row["id"] for row in as_json(listed)["sessions"]]

    assert prune() == ["a", "b", "c", "d"]
    assert prune("--model-like", "GPT-4O", "--min-messages", "2") == ["a", "d"]
    assert prune("--title-like", "deploy", "--max-messages", "2") == ["b"]
    assert prune("--archived", "yes") == ["d"] and prune("--archived", "no") == ["a", "b", "c"]
    assert prune("--user-id", "user-c", "--end-reason", "user_exit") == ["c"]
    assert prune("--started-after", "2020-01-02T00:00:00+00:00",
                 "--started-before", "1578096000") == ["b", "c"]
    assert prune("--older-than-days", "0", "--started-after", "1577923200") == ["b", "c", "d"]

    done = cli(hermes_home, "--json", "sessions", "prune", "--model-like", "gpt", "--max-messages",
               "3", "--archived", "no", "--yes")
    assert done.returncode == 0, done.stderr
    assert as_json(done)["deleted"] == ["a", "b"]
    with SessionDB(db_path, read_only=True) as db:
        assert sorted(s["id"] for s in db.search_sessions(limit=-1)) == ["c", "d"]

    for flag, value in [("--min-cost", "cheap"), ("--archived", "maybe"),
                        ("--started-before", "yesterday"), ("--max-tokens", "nan")]:
        refused = cli(hermes_home, "sessions", "prune", "--yes", flag, value)
        assert refused.returncode == 2 and flag in refused.stderr, refused.stderr
    with SessionDB(db_path, read_only=True) as db:
        assert db.session_count(include_archived=True) == 2


def test_prune_has_an_option_for_every_filter_of_the_vocabulary() -> None:
    from hermes_state_cli_sessions import PRUNE_FILTER_OPTIONS
    from hermes_state_deletion import PRUNE_FILTERS

    assert set(PRUNE_FILTER_OPTIONS) == set(PRUNE_FILTERS) - {"source"}


def test_recover_inspects_and_salvages_a_damaged_store(hermes_home: Path, db_path: Path,
                                                       tmp_path: Path) -> None:
    with SessionDB(db_path) as db:
        for n in range(6):
            db.create_session(f"s{n}", "cli")
            db.replace_messages(f"s{n}", [{"role": "user", "content": f"m{i} " + "z" * 400}
                                          for i in range(80)])
    leaves = btree_pages(db_path, "messages")["leaf"]
    overwrite_pages(db_path, [leaves[len(leaves) // 2]])
    before = file_hashes(hermes_home)

    inspect = cli(hermes_home, "--json", "sessions", "recover", "--inspect-only")
    assert inspect.returncode == 0, inspect.stderr
    report = as_json(inspect)
    assert report["output"] is None and report["tables"]["messages"]["lost"] > 0
    assert file_hashes(hermes_home) == before

    out = tmp_path / "recovered.db"
    result = cli(hermes_home, "sessions", "recover", "--input", str(db_path),
                 "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert "messages" in result.stdout and "excluded" in result.stdout
    assert "reading messages page by page" in result.stderr  # progress goes to stderr
    with SessionDB(out, read_only=True) as copy:
        assert copy.message_count() == report["tables"]["messages"]["found"]


def test_recover_exits_non_zero_only_when_nothing_can_be_read(hermes_home: Path,
                                                               tmp_path: Path) -> None:
    junk = tmp_path / "junk.db"
    junk.write_bytes(random.Random(9).randbytes(32 * 1024))
    result = cli(hermes_home, "sessions", "recover", "--input", str(junk), "--inspect-only")
    assert result.returncode == 1
    assert "nothing could be read" in result.stderr


def test_repair_check_only_repair_and_doctor_on_a_stale_index(store: list[str],
                                                               hermes_home: Path,
                                                               db_path: Path) -> None:
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("INSERT INTO state_meta VALUES ('fts_stale', 'corrupt')")
    conn.execute("DROP TRIGGER messages_fts_insert")
    conn.close()
    before = sha256(db_path)

    doctor = cli(hermes_home, "doctor", "--json")
    assert doctor.returncode == 1
    report = as_json(doctor)
    assert report["wal_reset_exposed"] in (True, False)
    assert any("sessions repair" in step for step in report["next"])
    check = cli(hermes_home, "sessions", "repair", "--check-only")
    assert check.returncode == 1
    assert "fts_stale" in check.stdout and "messages_fts_insert" in check.stdout
    assert sha256(db_path) == before

    repaired = cli(hermes_home, "--json", "sessions", "repair")
    assert repaired.returncode == 0, repaired.stderr
    assert as_json(repaired)["promoted"] is True
    assert cli(hermes_home, "sessions", "repair", "--check-only").returncode == 0
    assert cli(hermes_home, "doctor").returncode == 0


def test_backup_and_restore(store: list[str], hermes_home: Path, db_path: Path) -> None:
    backup = cli(hermes_home, "backup", "--json")
    assert backup.returncode == 0, backup.stderr
    snapshot = Path(as_json(backup)["snapshot"])
    assert snapshot.parent == hermes_home / "state-snapshots"
    conn = sqlite3.connect(db_path, isolation_level=None)
    conn.execute("DELETE FROM messages")
    conn.close()
    restored = cli(hermes_home, "restore", str(snapshot), "--json")
    assert restored.returncode == 0, restored.stderr
    assert as_json(restored)["row_counts"]["messages"] > 0


def test_profiles_are_resolved_and_aggregated(hermes_home: Path) -> None:
    with SessionDB(hermes_home / "profiles" / "coder" / "state.db") as db:
        populate(db, sessions=1, messages=1)
    with SessionDB(hermes_home / "state.db") as db:
        populate(db, sessions=2, messages=1)
    (hermes_home / "profiles" / "broken").mkdir()
    (hermes_home / "profiles" / "broken" / "state.db").write_bytes(b"\0" * 100)

    coder = cli(hermes_home, "--profile", "coder", "sessions", "stats", "--json")
    assert coder.returncode == 0 and as_json(coder)["sessions"] == 1
    everyone = cli(hermes_home, "sessions", "stats", "--all-profiles", "--json")
    assert everyone.returncode == 1  # one profile failed...
    result = as_json(everyone)
    assert {n: s["sessions"] for n, s in result["profiles"].items()} == {"default": 2, "coder": 1}
    assert [e["profile"] for e in result["errors"]] == ["broken"]  # ...and is named
    bad = cli(hermes_home, "--profile", "../escape", "sessions", "list")
    assert bad.returncode == 1 and "invalid profile name" in bad.stderr


def test_maintenance_never_creates_or_upgrades_a_store(hermes_home: Path, tmp_path: Path) -> None:
    assert cli(hermes_home, "sessions", "delete", "x").returncode == 1
    assert cli(hermes_home, "sessions", "prune").returncode == 1
    assert list(hermes_home.iterdir()) == []
    old = tmp_path / "old.db"
    conn = sqlite3.connect(old)
    conn.execute("CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT, started_at REAL)")
    conn.close()
    before = sha256(old)
    result = cli(hermes_home, "--db", str(old), "sessions", "prune")
    assert result.returncode == 1 and "upgrades the store" in result.stderr
    assert sha256(old) == before


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_doctor_reports_a_damaged_wal_frame_and_recover_salvages_the_commits_after_it(
    seed: int, hermes_home: Path, db_path: Path, tmp_path: Path
) -> None:
    store_of(db_path, "base", 1, 100, seed)
    acknowledged = append_and_die(db_path, "base-0", 20)
    wal = db_path.with_name("state.db-wal")
    rng = random.Random(seed)
    frame = rng.randrange(2, 10)
    flip_byte(wal, wal_frame_offset(wal, frame) + 24 + rng.randrange(4096))
    before = file_state(db_path)

    doctor = cli(hermes_home, "doctor", "--json")
    assert doctor.returncode == 1, doctor.stdout
    report = as_json(doctor)
    damage = report["wal_damage"]
    assert damage["damaged_frames"] == [frame] and damage["later_commits"] >= 19
    assert damage["rows_after_damage"]["messages"] >= 19
    assert any(f"damaged at frame {frame}" in p for p in report["problems"])
    assert any("sessions recover" in step for step in report["next"])
    text = cli(hermes_home, "doctor")
    assert f"! the -wal is damaged at frame {frame}" in text.stdout

    out = tmp_path / "recovered.db"
    result = cli(hermes_home, "sessions", "recover", "--output", str(out))
    assert result.returncode == 0, result.stderr
    assert f"note: the -wal is damaged at frame {frame}" in result.stdout
    assert file_state(db_path) == before  # neither command wrote the file or its -wal
    with SessionDB(out, read_only=True) as copy:
        ids = {m["id"] for m in copy.get_messages("base-0")}
    assert set(acknowledged) <= ids and len(ids) == 120


def test_doctor_finds_nothing_wrong_with_a_wal_of_committed_frames(
    store: list[str], hermes_home: Path, db_path: Path
) -> None:
    leave_committed_wal(db_path)
    result = cli(hermes_home, "doctor", "--json")
    assert result.returncode == 0, result.stdout
    assert "wal_damage" not in as_json(result)


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_recover_says_it_rolled_back_the_hot_journal_of_a_killed_restore(
    seed: int, hermes_home: Path, db_path: Path, tmp_path: Path
) -> None:
    store_of(db_path, "live", 3, 700, seed)
    store_of(tmp_path / "snapshot.db", "snap", 3, 700, seed + 100)
    with SessionDB(db_path, read_only=True) as db:
        count = db.message_count()
    kill_restore_midway(hermes_home, db_path, tmp_path / "snapshot.db")

    result = cli(hermes_home, "sessions", "recover", "--inspect-only")
    assert result.returncode == 0, result.stderr
    assert "note: the source has a hot rollback journal" in result.stdout
    messages = next(line for line in result.stdout.splitlines() if line.startswith("messages"))
    assert messages.split()[1:4] == [str(count), "-", "0"]
    report = as_json(cli(hermes_home, "--json", "sessions", "recover", "--inspect-only"))
    assert report["journal"]["rolled_back_pages"] > 10
