"""Deleting, pruning and archiving as the callers of the previous SessionDB use them: delegate
children go with their session, other children are detached, transcript files go after the
commit, the prune filters against a brute-force oracle, the clean-ups, vacuum, the automatic
prune that never raises."""

from __future__ import annotations

import json
import logging
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import subprocess_env
from state_helpers import Connections
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hermes_state_replication as replication
from hermes_state import (
    HermesStateError,
    InvalidInputError,
    LedgerBusyError,
    SessionDB,
    StateDbConstraintError,
    StateDbCorruptError,
    StateDbLockedError,
    Timing,
    UnknownFilterError,
)

DAY = 86400.0
CANDIDATE_KEYS = {"id", "source", "title", "model", "started_at", "ended_at", "message_count",
                  "archived"}


def spawn(code: str, *args: str) -> subprocess.Popen[str]:
    """A fresh interpreter running ``code``, its stdin and stdout piped (a go signal, a reply)."""
    return subprocess.Popen([sys.executable, "-c", code, *args], env=subprocess_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)


def raw(db: SessionDB) -> sqlite3.Connection:
    return sqlite3.connect(db.path, isolation_level=None)


def existing(db: SessionDB, ids: list[str]) -> set[str]:
    return {sid for sid in ids if db.get_session(sid) is not None}


def transcripts(sessions_dir: Path, session_id: str) -> list[Path]:
    """The three kinds of transcript file a session has, created."""
    sessions_dir.mkdir(exist_ok=True)
    paths = [sessions_dir / f"{session_id}.json", sessions_dir / f"{session_id}.jsonl",
             sessions_dir / f"request_dump_{session_id}_1700000000.json"]
    for path in paths:
        path.write_text("{}")
    return paths


def admit(db: SessionDB, session_id: str, status: str = "queued") -> None:
    conn = raw(db)
    conn.execute("INSERT INTO session_admissions (session_id, payload_json, status, created_at)"
                 " VALUES (?, '{}', ?, 0)", (session_id, status))
    conn.close()


# --- delete_session: delegate chains, detached children, files -------------------------------


def delegate_tree(db: SessionDB, seed: int, sessions_dir: Path) -> dict[str, Any]:
    """A root with children of every kind, delegates nested several levels deep (some tagged
    only by ``_delegate_from``, without a parent link), each with messages and files."""
    rng = random.Random(seed)
    kinds: dict[str, str] = {"root": "root"}
    parents: dict[str, str | None] = {"root": None}
    tagged: dict[str, str | None] = {"root": None}
    db.create_session("root", "cli")
    for n in range(30):
        sid = f"n{n:02d}"
        anchor = rng.choice(list(kinds))
        kind = rng.choice(["delegate", "delegate", "delegate-unlinked", "branch", "continuation",
                           "untagged"])
        config: dict[str, str] = {}
        parent: str | None = anchor
        if kind.startswith("delegate"):
            config["_delegate_from"] = anchor
            parent = None if kind == "delegate-unlinked" else anchor
        elif kind == "branch":
            config["_branched_from"] = anchor
        db.create_session(sid, "cli", model_config=config or None, parent_session_id=parent)
        kinds[sid], parents[sid], tagged[sid] = kind, parent, config.get("_delegate_from")
    for sid in kinds:
        db.append_message(sid, "user", f"message of {sid}")
        transcripts(sessions_dir, sid)
    # the oracle: what deleting the root takes along
    doomed, grew = {"root"}, True
    while grew:
        grew = False
        for sid in kinds:
            delegate = tagged[sid] is not None
            if sid not in doomed and delegate and (tagged[sid] in doomed or parents[sid] in doomed):
                doomed.add(sid)
                grew = True
    return {"ids": list(kinds), "doomed": doomed, "parents": parents}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_delete_takes_delegate_chains_and_detaches_every_other_child(
    db: SessionDB, tmp_path: Path, seed: int
) -> None:
    sessions_dir = tmp_path / "sessions"
    tree = delegate_tree(db, seed, sessions_dir)
    doomed = tree["doomed"]
    assert {r["id"] for r in db.list_delete_candidates("root")} == doomed
    assert db.list_delete_candidates("root")[0]["id"] == "root"
    assert db.delete_session("root", sessions_dir=sessions_dir) is True
    survivors = set(tree["ids"]) - doomed
    assert existing(db, tree["ids"]) == survivors
    for sid in doomed:
        assert db.get_messages(sid) == []
        assert not list(sessions_dir.glob(f"*{sid}*")), sid
    for sid in survivors:
        assert [m["content"] for m in db.get_messages(sid)] == [f"message of {sid}"]
        assert len(list(sessions_dir.glob(f"*{sid}*"))) == 3, sid
        parent = db.get_session(sid)["parent_session_id"]
        expected = tree["parents"][sid]
        assert parent == (None if expected in doomed else expected)
    assert db.delete_session("root", sessions_dir=sessions_dir) is False


def test_a_delete_of_a_delegate_leaves_its_parent_and_the_requested_id_never_recurses_up(
    db: SessionDB,
) -> None:
    db.create_session("parent", "cli")
    db.create_session("d1", "cli", parent_session_id="parent",
                      model_config={"_delegate_from": "parent"})
    db.create_session("d2", "cli", parent_session_id="d1", model_config={"_delegate_from": "d1"})
    db.create_session("d3", "cli", parent_session_id="d2",
                      model_config={"_delegate_from": "__orphaned__"})
    assert db.delete_session("d1") is True
    assert existing(db, ["parent", "d1", "d2", "d3"]) == {"parent"}


def test_deleting_an_unknown_session_is_false_and_removes_no_file(
    db: SessionDB, tmp_path: Path
) -> None:
    sessions_dir = tmp_path / "sessions"
    files = transcripts(sessions_dir, "ghost")
    assert db.delete_session("ghost", sessions_dir=sessions_dir) is False
    assert all(p.exists() for p in files)
    assert db.list_delete_candidates("ghost") == []


def test_without_a_sessions_dir_no_file_is_touched(db: SessionDB, hermes_home: Path) -> None:
    files = transcripts(hermes_home / "sessions", "s")
    db.create_session("s", "cli")
    assert db.delete_session("s") is True
    assert all(p.exists() for p in files)


def test_an_id_with_separators_names_no_file_outside_the_sessions_dir(
    db: SessionDB, tmp_path: Path
) -> None:
    sessions_dir = tmp_path / "sessions"
    sessions_dir.mkdir()
    outside = tmp_path / "victim.json"
    outside.write_text("keep me")
    db.create_session("../victim", "cli")
    assert db.delete_session("../victim", sessions_dir=sessions_dir) is True
    assert outside.read_text() == "keep me"
    globbed = sessions_dir / "request_dump_a*b_1.json"  # a glob character is literal
    globbed.write_text("{}")
    db.create_session("a", "cli")
    assert db.delete_session("a", sessions_dir=sessions_dir) is True
    assert globbed.exists()


def test_a_quarantine_spool_is_never_removed_with_the_transcripts(
    db_path: Path, hermes_home: Path, tmp_path: Path,
    damage_messages_table: Callable[[Path], None], caplog: pytest.LogCaptureFixture,
) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "before the damage")
    damage_messages_table(db_path)
    with SessionDB(db_path) as damaged:
        with pytest.raises(StateDbCorruptError) as refused:
            damaged.append_message("s", "user", "written while the store was damaged")
    spool = refused.value.spooled_to
    sessions_dir = hermes_home / "sessions"
    assert spool == sessions_dir / "s.jsonl"
    files = [p for p in transcripts_without_jsonl(sessions_dir, "s")]
    with SessionDB(tmp_path / "repaired.db") as repaired:  # the store the operator rebuilt
        repaired.create_session("s", "cli")
        with caplog.at_level(logging.WARNING, logger="hermes_state"):
            assert repaired.delete_session("s", sessions_dir=sessions_dir) is True
    assert "written while the store was damaged" in spool.read_text()
    assert not any(p.exists() for p in files) and "quarantined" in caplog.text


def transcripts_without_jsonl(sessions_dir: Path, session_id: str) -> list[Path]:
    paths = [sessions_dir / f"{session_id}.json",
             sessions_dir / f"request_dump_{session_id}_1700000000.json"]
    for path in paths:
        path.write_text("{}")
    return paths


def test_live_work_on_a_delegate_child_refuses_the_whole_delete(
    db: SessionDB, tmp_path: Path
) -> None:
    sessions_dir = tmp_path / "sessions"
    db.create_session("root", "cli")
    db.create_session("d", "cli", parent_session_id="root",
                      model_config={"_delegate_from": "root"})
    files = transcripts(sessions_dir, "root") + transcripts(sessions_dir, "d")
    db.append_message("root", "user", "keep")
    admit(db, "d", "started")
    with pytest.raises(LedgerBusyError) as info:
        db.delete_session("root", sessions_dir=sessions_dir)
    assert info.value.session_id == "d"
    assert existing(db, ["root", "d"]) == {"root", "d"} and db.message_count("root") == 1
    assert all(p.exists() for p in files)


def test_files_stay_when_the_delete_never_commits(
    db_path: Path, open_db: Any, tmp_path: Path, hold_write_lock: Any
) -> None:
    db = open_db(db_path, timing=Timing(write_patience_s=0.3))
    sessions_dir = tmp_path / "sessions"
    db.create_session("s", "cli")
    files = transcripts(sessions_dir, "s")
    with hold_write_lock(db.path):
        with pytest.raises(StateDbLockedError):
            db.delete_session("s", sessions_dir=sessions_dir)
    assert all(p.exists() for p in files) and db.get_session("s") is not None
    assert db.delete_session("s", sessions_dir=sessions_dir) is True
    assert not any(p.exists() for p in files)


def test_bad_arguments_are_typed_and_delete_nothing(db: SessionDB) -> None:
    db.create_session("s", "cli")
    with pytest.raises(InvalidInputError):
        db.delete_session("s", sessions_dir=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        db.delete_session(7)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        db.delete_sessions("s")  # one id, not a list of them
    assert db.get_session("s") is not None


def test_a_closed_handle_refuses_every_delete(db_path: Path) -> None:
    db = SessionDB(db_path)
    db.create_session("s", "cli")
    db.close()
    for call in (lambda: db.delete_session("s"), lambda: db.delete_sessions(["s"]),
                 lambda: db.prune_sessions(None), lambda: db.list_prune_candidates(),
                 lambda: db.count_empty_sessions(), lambda: db.archive_sessions()):
        with pytest.raises(HermesStateError):
            call()


DELETE_IN_CHILD = """
import sys
from pathlib import Path
from hermes_state import SessionDB
db = SessionDB(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
db.delete_session("root", sessions_dir=Path(sys.argv[2]))
print("done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_a_delete_killed_midway_takes_all_of_its_sessions_or_none(
    db_path: Path, tmp_path: Path, seed: int
) -> None:
    sessions_dir = tmp_path / "sessions"
    with SessionDB(db_path) as db:
        tree = delegate_tree(db, seed, sessions_dir)
        for sid in tree["doomed"]:  # enough rows that the transaction takes a while
            for i in range(40):
                db.append_message(sid, "assistant", f"{sid} {i} " + "x" * 2000)
    child = spawn(DELETE_IN_CHILD, str(db_path), str(sessions_dir))
    assert child.stdout.readline().strip() == "ready"
    child.stdin.write("go\n")
    child.stdin.flush()
    time.sleep(random.Random(seed).uniform(0.02, 0.12))  # before the delete, or after its commit
    child.send_signal(signal.SIGKILL)
    child.wait()
    with SessionDB(db_path) as db:
        left = existing(db, tree["ids"])
        survivors = set(tree["ids"]) - tree["doomed"]
        assert left in (set(tree["ids"]), survivors)  # one transaction: all or nothing
        for sid in survivors:
            assert db.message_count(sid) == 1
        if left == set(tree["ids"]):  # not committed: every file is still there
            for sid in tree["doomed"]:
                assert len(list(sessions_dir.glob(f"*{sid}*"))) == 3
            assert db.delete_session("root", sessions_dir=sessions_dir) is True
        assert existing(db, tree["ids"]) == survivors


# --- delete_sessions and delete_session_if_empty ---------------------------------------------


def test_a_batch_delete_drops_bad_ids_collapses_duplicates_and_cascades(
    db: SessionDB, tmp_path: Path
) -> None:
    sessions_dir = tmp_path / "sessions"
    for sid in ("a", "b", "keep"):
        db.create_session(sid, "cli")
    db.create_session("a-delegate", "cli", parent_session_id="a",
                      model_config={"_delegate_from": "a"})
    db.create_session("b-branch", "cli", parent_session_id="b",
                      model_config={"_branched_from": "b"})
    files = transcripts(sessions_dir, "a-delegate")
    ids: list[Any] = ["a", "a", "", None, 3, "missing", "b"]
    assert db.delete_sessions(ids, sessions_dir=sessions_dir) == 2
    assert existing(db, ["a", "b", "keep", "a-delegate", "b-branch"]) == {"keep", "b-branch"}
    assert db.get_session("b-branch")["parent_session_id"] is None
    assert not any(p.exists() for p in files)
    assert db.delete_sessions([]) == 0


def test_a_batch_with_a_busy_session_deletes_nothing(db: SessionDB) -> None:
    db.create_session("a", "cli")
    db.create_session("busy", "cli")
    admit(db, "busy")
    with pytest.raises(LedgerBusyError):
        db.delete_sessions(["a", "busy"])
    assert existing(db, ["a", "busy"]) == {"a", "busy"}


def test_only_an_untitled_childless_session_without_messages_is_empty(
    db: SessionDB, tmp_path: Path
) -> None:
    sessions_dir = tmp_path / "sessions"
    db.create_session("live-empty", "cli")
    db.create_session("ended-empty", "cli")
    db.end_session("ended-empty", "user_exit")
    db.create_session("titled", "cli", title="a title")
    db.create_session("spoken", "cli")
    db.append_message("spoken", "user", "hi")
    db.create_session("parent", "cli")
    db.create_session("child", "cli", parent_session_id="parent",
                      model_config={"_delegate_from": "parent"})
    db.create_session("busy", "cli")
    admit(db, "busy")
    files = transcripts(sessions_dir, "live-empty")
    assert db.delete_session_if_empty("live-empty", sessions_dir=sessions_dir) is True
    assert not any(p.exists() for p in files)
    assert db.delete_session_if_empty("ended-empty") is True
    for kept in ("titled", "spoken", "parent", "busy", "missing"):
        assert db.delete_session_if_empty(kept) is False, kept
    assert existing(db, ["titled", "spoken", "parent", "child", "busy"]) == {
        "titled", "spoken", "parent", "child", "busy"}


APPEND_IN_CHILD = """
import sys
from hermes_state import SessionDB, HermesStateError
db = SessionDB(sys.argv[1])
print("ready", flush=True)
sys.stdin.readline()
try:
    db.append_message("s", "user", "flushed while the other side cleans up")
    print("appended", flush=True)
except HermesStateError as exc:
    print("refused", type(exc).__name__, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", [21, 22, 23])
def test_a_message_flushed_concurrently_is_never_deleted_with_an_empty_session(
    db_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    for _ in range(4):
        with SessionDB(db_path) as db:
            db.create_session("s", "cli")
            child = spawn(APPEND_IN_CHILD, str(db_path))
            assert child.stdout.readline().strip() == "ready"
            child.stdin.write("go\n")
            child.stdin.flush()
            time.sleep(rng.uniform(0.0, 0.05))
            deleted = db.delete_session_if_empty("s")
            outcome = child.stdout.readline().split()
            child.wait()
            if outcome[:1] == ["appended"]:  # a flushed message is never deleted
                assert not deleted and db.message_count("s") == 1
            else:  # refused only because the session had gone first
                assert outcome == ["refused", "SessionNotFoundError"] and deleted
            if db.get_session("s") is not None:
                db.delete_session("s")


# --- the prune selection: the filters against an oracle --------------------------------------


NOW = time.time()
SOURCES = ["cli", "telegram", "tui"]


def random_rows(rng: random.Random, count: int) -> list[dict[str, Any]]:
    """``count`` sessions with every column a filter reads drawn from a few values each,
    parents among the earlier ones, about one in twelve with live ledger work."""
    rows: list[dict[str, Any]] = []
    for n in range(count):
        ended = rng.random() < 0.8
        parent = rng.choice([r["id"] for r in rows]) if rows and rng.random() < 0.3 else None
        title = rng.choice(["Deploy notes", "deploy 100%", "a_b", "x"]) + f" {n}"
        rows.append({
            "id": f"s{n:02d}",
            "source": rng.choice(SOURCES),
            "started_at": NOW - rng.choice([1, 10, 40, 95, 200]) * DAY,
            "ended_at": NOW if ended else None,
            "end_reason": rng.choice(["user_exit", "user_exit", "compression", "timeout"])
            if ended else None,
            "user_id": rng.choice([None, "u1", "u2"]),
            "chat_id": rng.choice([None, "c1", "c2"]),
            "chat_type": rng.choice([None, "dm", "group"]),
            "billing_provider": rng.choice([None, "OpenAI", "openai", "anthropic"]),
            "title": title if rng.random() < 0.7 else None,
            "model": rng.choice([None, "gpt-4o", "claude-3", "GPT-mini"]),
            "git_branch": rng.choice([None, "main", "feature/Deploy"]),
            "cwd": rng.choice([None, "/w", "/w/x", "/wx", "C:\\w\\y", "/", "/w\\z"]),
            "message_count": rng.randint(0, 5),
            "input_tokens": rng.randint(0, 50),
            "output_tokens": rng.randint(0, 50),
            "actual_cost_usd": rng.choice([None, 0.5, 2.0]),
            "estimated_cost_usd": rng.choice([None, 1.0, 3.0]),
            "tool_call_count": rng.randint(0, 4),
            "archived": int(rng.random() < 0.3),
            "parent_session_id": parent,
            "busy": rng.random() < 0.08,
        })
    return rows


# Each filter's values: bounds that equal some rows' values, cases that differ only by case,
# LIKE's own wildcards taken literally, prefixes with and without their trailing separator.
FILTER_VALUES: dict[str, list[Any]] = {
    "started_before": [NOW - 40 * DAY, NOW - 100 * DAY, None],
    "started_after": [NOW - 95 * DAY, NOW - 20 * DAY],
    "end_reason": ["user_exit", "compression"],
    "user_id": ["u1", "u2"],
    "chat_id": ["c1"],
    "chat_type": ["dm", "group"],
    "provider": ["openai", "OPENAI", "anthropic"],
    "title_like": ["deploy", "100%", "_", "a_b", "NOTES"],
    "model_like": ["gpt", "CLAUDE", "-"],
    "branch_like": ["deploy", "MAIN"],
    "cwd_prefix": ["/w", "/w/", "/", "C:\\w", "/w/x", "/w\\"],
    "min_messages": [0, 2, 5], "max_messages": [0, 2, 5],
    "min_tokens": [0, 40, 100], "max_tokens": [0, 40, 100],
    "min_cost": [0, 0.5, 1.5, 2.5], "max_cost": [0, 0.5, 1.5, 2.5],
    "min_tool_calls": [0, 2, 4], "max_tool_calls": [0, 2, 4],
    "archived": [None, True, False],
}


def _contains(haystack: str | None, needle: str) -> bool:
    return haystack is not None and needle.lower() in haystack.lower()


def _cwd_matches(cwd: str | None, prefix: str) -> bool:
    prefix = prefix.rstrip("/\\") or prefix
    return cwd is not None and (cwd == prefix or cwd.startswith((prefix + "/", prefix + "\\")))


ORACLE: dict[str, Callable[[dict[str, Any], Any], bool]] = {
    "started_before": lambda r, v: r["started_at"] < v,
    "started_after": lambda r, v: r["started_at"] >= v,
    "source": lambda r, v: r["source"] == v,
    "end_reason": lambda r, v: r["end_reason"] == v,
    "user_id": lambda r, v: r["user_id"] == v,
    "chat_id": lambda r, v: r["chat_id"] == v,
    "chat_type": lambda r, v: r["chat_type"] == v,
    "provider": lambda r, v: (r["billing_provider"] or "\0").lower() == v.lower(),
    "title_like": lambda r, v: _contains(r["title"], v),
    "model_like": lambda r, v: _contains(r["model"], v),
    "branch_like": lambda r, v: _contains(r["git_branch"], v),
    "cwd_prefix": lambda r, v: _cwd_matches(r["cwd"], v),
    "min_messages": lambda r, v: r["message_count"] >= v,
    "max_messages": lambda r, v: r["message_count"] <= v,
    "min_tokens": lambda r, v: r["input_tokens"] + r["output_tokens"] >= v,
    "max_tokens": lambda r, v: r["input_tokens"] + r["output_tokens"] <= v,
    "min_cost": lambda r, v: _cost(r) >= v,
    "max_cost": lambda r, v: _cost(r) <= v,
    "min_tool_calls": lambda r, v: r["tool_call_count"] >= v,
    "max_tool_calls": lambda r, v: r["tool_call_count"] <= v,
    "archived": lambda r, v: bool(r["archived"]) == v,
}


def _cost(row: dict[str, Any]) -> float:
    for key in ("actual_cost_usd", "estimated_cost_usd"):
        if row[key] is not None:
            return float(row[key])
    return 0.0


def _members(rows: dict[str, dict[str, Any]], sid: str) -> set[str]:
    """The conversation of ``sid`` as the lineage module defines it, walked in Python."""
    root = sid
    while True:
        parent = rows[root]["parent_session_id"]
        if parent is None or rows[parent]["end_reason"] != "compression" or parent == sid:
            break
        root = parent
    members, stack = {root}, [root]
    while stack:
        node = stack.pop()
        if rows[node]["end_reason"] != "compression":
            continue
        for child in rows.values():
            if child["parent_session_id"] == node and child["id"] not in members:
                members.add(child["id"])
                stack.append(child["id"])
    return members


def oracle_selection(rows: list[dict[str, Any]], older_than_days: float | None,
                     source: str | None, filters: dict[str, Any]) -> list[str]:
    bounds = {**filters, "source": source}
    if bounds.get("started_before") is None and older_than_days is not None:
        bounds["started_before"] = NOW - older_than_days * DAY
    chosen = {
        r["id"] for r in rows
        if r["ended_at"] is not None and not r["busy"]
        and all(ORACLE[name](r, value) for name, value in bounds.items() if value is not None)
    }
    by_id = {r["id"]: r for r in rows}
    return sorted(sid for sid in chosen if _members(by_id, sid) <= chosen)


def load(db: SessionDB, rows: list[dict[str, Any]]) -> None:
    conn = raw(db)
    conn.execute("DELETE FROM session_admissions")
    conn.execute("DELETE FROM sessions")
    conn.close()
    for row in rows:
        columns = {k: v for k, v in row.items() if k not in ("id", "source", "busy")}
        db.create_session(row["id"], row["source"], **columns)
        if row["busy"]:
            admit(db, row["id"])


@pytest.mark.parametrize("seed", [31, 32, 33])
def test_each_filter_alone_selects_what_the_oracle_selects(db: SessionDB, seed: int) -> None:
    rows = random_rows(random.Random(seed), 40)
    load(db, rows)
    for name, values in FILTER_VALUES.items():
        for value in values:
            listed = db.list_prune_candidates(None, **{name: value})
            assert sorted(r["id"] for r in listed) == oracle_selection(
                rows, None, None, {name: value}), (name, value)
    for days, source in ((30, None), (90, "cli"), (None, "tui")):
        assert sorted(r["id"] for r in db.list_prune_candidates(days, source)) == \
            oracle_selection(rows, days, source, {})


@pytest.mark.slow
@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rng=st.randoms(use_true_random=False),
       count=st.integers(1, 24),
       names=st.lists(st.sampled_from(sorted(FILTER_VALUES)), max_size=3, unique=True),
       data=st.data(),
       older_than_days=st.sampled_from([None, 30, 90]),
       source=st.sampled_from([None, "cli", "tui"]))
def test_filter_combinations_prune_exactly_what_a_brute_force_oracle_selects(
    db: SessionDB, rng: random.Random, count: int, names: list[str], data: st.DataObject,
    older_than_days: float | None, source: str | None,
) -> None:
    rows = random_rows(rng, count)
    load(db, rows)
    filters = {name: data.draw(st.sampled_from(FILTER_VALUES[name]), label=name)
               for name in names}
    listed = db.list_prune_candidates(older_than_days, source, **filters)
    expected = oracle_selection(rows, older_than_days, source, filters)
    assert sorted(r["id"] for r in listed) == expected
    assert all(set(r) == CANDIDATE_KEYS for r in listed)
    assert [(r["started_at"], r["id"]) for r in listed] == sorted(
        (r["started_at"], r["id"]) for r in listed)
    ids = [r["id"] for r in rows]
    assert db.prune_sessions(older_than_days, source, **filters) == len(expected)
    assert existing(db, ids) == set(ids) - set(expected)
    for sid in existing(db, ids):  # the parents that went are detached, the rest kept
        parent = db.get_session(sid)["parent_session_id"]
        assert parent is None or parent not in expected


def test_an_unknown_filter_is_a_typed_type_error_and_bad_values_are_refused(
    db: SessionDB,
) -> None:
    db.create_session("s", "cli", started_at=NOW - 200 * DAY)
    db.end_session("s", "user_exit")
    for call in (db.list_prune_candidates, db.prune_sessions, db.archive_sessions):
        with pytest.raises(UnknownFilterError) as info:
            call(older_than_days=None, title_contains="x")
        assert isinstance(info.value, TypeError) and info.value.names == ["title_contains"]
    for bad in ({"min_messages": "3"}, {"started_before": float("nan")},
                {"archived": 1}, {"title_like": 5}, {"min_cost": True}):
        with pytest.raises(InvalidInputError):
            db.prune_sessions(None, **bad)
    with pytest.raises(InvalidInputError):
        db.list_prune_candidates(older_than_days=-1)
    assert db.get_session("s") is not None


def test_explicit_bounds_with_no_age_and_none_values_as_the_callers_pass_them(
    db: SessionDB,
) -> None:
    for sid, days in (("old", 200), ("mid", 60), ("new", 5)):
        db.create_session(sid, "cli", started_at=NOW - days * DAY)
        db.end_session(sid, "user_exit")
    filters = {"started_before": NOW - 30 * DAY, "started_after": NOW - 100 * DAY,
               "title_like": None, "archived": None}
    assert [r["id"] for r in db.list_prune_candidates(older_than_days=None, **filters)] == [
        "mid"]
    assert db.list_prune_candidates(older_than_days=1, started_before=NOW - 100 * DAY) == [
        db.list_prune_candidates(None, started_before=NOW - 100 * DAY)[0]]
    assert [r["id"] for r in db.list_prune_candidates()] == ["old", "mid", "new"]
    every_bound_none = dict.fromkeys(FILTER_VALUES, None)  # a form with every field left empty
    assert [r["id"] for r in db.list_prune_candidates(None, None, **every_bound_none)] == [
        "old", "mid", "new"]
    assert db.prune_sessions() == 1  # 90 days by default
    assert existing(db, ["old", "mid", "new"]) == {"mid", "new"}


def test_a_prune_removes_transcripts_and_does_not_cascade(db: SessionDB, tmp_path: Path) -> None:
    sessions_dir = tmp_path / "sessions"
    db.create_session("old", "cli", started_at=NOW - 200 * DAY)
    db.end_session("old", "user_exit")
    db.create_session("delegate", "cli", parent_session_id="old",
                      model_config={"_delegate_from": "old"})
    gone, kept = transcripts(sessions_dir, "old"), transcripts(sessions_dir, "delegate")
    assert db.prune_sessions(sessions_dir=sessions_dir) == 1
    assert db.get_session("delegate")["parent_session_id"] is None
    assert not any(p.exists() for p in gone) and all(p.exists() for p in kept)


def test_archive_sessions_archives_whole_conversations_and_a_rerun_does_nothing(
    db: SessionDB,
) -> None:
    db.create_session("root", "cli", started_at=NOW - 200 * DAY)
    db.end_session("root", "compression")
    db.create_session("tip", "cli", parent_session_id="root", started_at=NOW - 150 * DAY)
    db.end_session("tip", "user_exit")
    db.create_session("recent", "cli")
    db.end_session("recent", "user_exit")
    assert db.archive_sessions(older_than_days=90) == 2
    assert [db.get_session(s)["archived"] for s in ("root", "tip", "recent")] == [1, 1, 0]
    assert db.archive_sessions(older_than_days=90) == 0
    assert db.session_count(include_archived=True) == 3


# --- empty sessions, ghosts, orphaned compression continuations ------------------------------


def test_empty_sessions_are_counted_and_deleted_with_every_child_detached(
    db: SessionDB, tmp_path: Path
) -> None:
    sessions_dir = tmp_path / "sessions"
    db.create_session("empty", "cli")
    db.end_session("empty", "user_exit")
    db.create_session("delegate", "cli", parent_session_id="empty",
                      model_config={"_delegate_from": "empty"})
    db.create_session("live-empty", "cli")
    db.create_session("archived-empty", "cli", archived=1)
    db.end_session("archived-empty", "user_exit")
    db.create_session("busy-empty", "cli")
    db.end_session("busy-empty", "user_exit")
    admit(db, "busy-empty")
    db.create_session("spoken", "cli")
    db.append_message("spoken", "user", "hi")
    db.end_session("spoken", "user_exit")
    files = transcripts(sessions_dir, "empty")
    assert db.count_empty_sessions() == 2
    assert db.delete_empty_sessions(sessions_dir=sessions_dir) == 1
    assert db.get_session("empty") is None and not any(p.exists() for p in files)
    assert db.get_session("delegate")["parent_session_id"] is None
    assert existing(db, ["live-empty", "archived-empty", "busy-empty", "spoken"]) == {
        "live-empty", "archived-empty", "busy-empty", "spoken"}


def ghost(db: SessionDB, sid: str, *, source: str = "tui", days: float = 2,
          title: str | None = None, ended: bool = True) -> None:
    db.create_session(sid, source, started_at=NOW - days * DAY, title=title)
    if ended:
        db.end_session(sid, "user_exit")


def test_ghosts_are_old_ended_untitled_silent_tui_sessions(db: SessionDB, tmp_path: Path) -> None:
    sessions_dir = tmp_path / "sessions"
    ghost(db, "ghost")
    files = transcripts(sessions_dir, "ghost")
    ghost(db, "cli", source="cli")
    ghost(db, "young", days=0.5)
    ghost(db, "titled", title="named")
    ghost(db, "live", ended=False)
    ghost(db, "spoken")
    db.append_message("spoken", "user", "hi")
    assert db.prune_empty_ghost_sessions(sessions_dir=sessions_dir) == 1
    assert db.get_session("ghost") is None and not any(p.exists() for p in files)
    assert existing(db, ["cli", "young", "titled", "live", "spoken"]) == {
        "cli", "young", "titled", "live", "spoken"}


def test_a_ghost_with_a_child_is_a_typed_error_and_no_ghost_is_deleted(db: SessionDB) -> None:
    ghost(db, "a-ghost")
    ghost(db, "b-ghost")
    db.create_session("child", "tui", parent_session_id="b-ghost")
    with pytest.raises(StateDbConstraintError):
        db.prune_empty_ghost_sessions()
    assert existing(db, ["a-ghost", "b-ghost", "child"]) == {"a-ghost", "b-ghost", "child"}


def test_orphaned_compression_continuations_are_ended_once(db: SessionDB) -> None:
    db.create_session("parent", "cli", started_at=NOW - 20 * DAY)
    db.end_session("parent", "compression")
    db.create_session("other-parent", "cli", started_at=NOW - 20 * DAY)
    db.end_session("other-parent", "user_exit")
    cases = {"orphan": {}, "young": {"days": 3}, "called": {"api_call_count": 2},
             "silent": {"silent": True}, "wrong-parent": {"parent": "other-parent"}}
    for sid, case in cases.items():
        db.create_session(sid, "cli", parent_session_id=case.get("parent", "parent"),
                          started_at=NOW - case.get("days", 8) * DAY,
                          api_call_count=case.get("api_call_count"))
        if not case.get("silent"):
            db.append_message(sid, "user", "left behind")
    assert db.finalize_orphaned_compression_sessions() == 1
    row = db.get_session("orphan")
    assert row["end_reason"] == "orphaned_compression" and row["ended_at"] is not None
    assert db.message_count("orphan") == 1
    assert all(db.get_session(s)["ended_at"] is None for s in cases if s != "orphan")
    assert db.finalize_orphaned_compression_sessions() == 0


# --- archiving one conversation, ending, releasing -------------------------------------------


def test_set_session_archived_reaches_the_compression_lineage_only(db: SessionDB) -> None:
    db.create_session("root", "cli")
    db.end_session("root", "compression")
    db.create_session("mid", "cli", parent_session_id="root")
    db.end_session("mid", "compression")
    db.create_session("tip", "cli", parent_session_id="mid")
    db.create_session("tip-branch", "cli", parent_session_id="tip",
                      model_config={"_branched_from": "tip"})
    db.create_session("mid-delegate", "cli", parent_session_id="mid",
                      model_config={"_delegate_from": "mid"})
    db.create_session("unrelated", "cli")
    assert db.set_session_archived("mid", True) is True
    archived = {s for s in ("root", "mid", "tip", "tip-branch", "mid-delegate", "unrelated")
                if db.get_session(s)["archived"]}
    assert archived == {"root", "mid", "tip", "mid-delegate"}
    assert db.set_session_archived("tip", False) is True
    assert not any(db.get_session(s)["archived"] for s in archived)
    assert db.set_session_archived("missing", True) is False


def test_end_session_returns_none_keeps_the_first_reason_and_ignores_unknown_ids(
    db: SessionDB,
) -> None:
    db.create_session("s", "cli")
    assert db.end_session("s", "user_exit") is None
    assert db.end_session("s", "timeout") is None
    assert db.get_session("s")["end_reason"] == "user_exit"
    assert db.end_session("missing", "user_exit") is None


def test_release_compression_lock_returns_none_and_logs_store_errors(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    db = SessionDB(db_path)
    assert db.try_acquire_compression_lock("s", "me")
    assert db.release_compression_lock("s", "someone else") is None
    assert db.get_compression_lock_holder("s") == "me"
    assert db.release_compression_lock("s", "me") is None
    assert db.get_compression_lock_holder("s") is None
    db.close()
    with caplog.at_level(logging.WARNING, logger="hermes_state"):
        assert db.release_compression_lock("s", "me") is None
    assert "release_compression_lock" in caplog.text


# --- vacuum and the automatic prune ----------------------------------------------------------


def test_vacuum_merges_every_index_and_keeps_the_data(db: SessionDB) -> None:
    db.create_session("s", "cli")
    for i in range(30):
        db.append_message("s", "user", f"東京 message {i}")
    assert db.vacuum() == 3
    assert len(db.search_messages("message")) > 0 and db.message_count("s") == 30
    assert db.search_messages("東京")


def test_vacuum_leaves_checkpoints_to_litestream_when_told(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(replication.CHECKPOINTS_ENV, "litestream")
    connections = Connections()
    with SessionDB(db_path, on_connect=connections) as db:
        db.create_session("s", "cli")
        db.append_message("s", "user", "replicated")
        trace = connections.of("handle")
        trace.clear()
        assert db.vacuum() == 3
        assert trace[-1] == "VACUUM" and not [sql for sql in trace if "checkpoint" in sql]
        assert db.message_count("s") == 1


def test_the_automatic_prune_reports_skips_and_remembers_its_run(
    db: SessionDB, tmp_path: Path
) -> None:
    sessions_dir = tmp_path / "sessions"
    db.create_session("stale", "cli", started_at=NOW - 200 * DAY)
    db.end_session("stale", "user_exit")
    files = transcripts(sessions_dir, "stale")
    db.set_meta("last_auto_prune", "not a number")  # counts as never
    assert db.maybe_auto_prune_and_vacuum(sessions_dir=sessions_dir) == {
        "skipped": False, "pruned": 1, "vacuumed": True}
    assert not any(p.exists() for p in files)
    assert abs(float(db.get_meta("last_auto_prune")) - time.time()) < 60
    assert db.maybe_auto_prune_and_vacuum() == {"skipped": True, "pruned": 0, "vacuumed": False}
    nothing = db.maybe_auto_prune_and_vacuum(min_interval_hours=0, vacuum=True)
    assert nothing == {"skipped": False, "pruned": 0, "vacuumed": False}


def test_the_automatic_prune_never_raises(db_path: Path, hold_write_lock: Any) -> None:
    db = SessionDB(db_path, timing=Timing(write_patience_s=0.3))
    db.create_session("stale", "cli", started_at=NOW - 200 * DAY)
    db.end_session("stale", "user_exit")
    with hold_write_lock(db.path):
        locked = db.maybe_auto_prune_and_vacuum()
    assert locked["pruned"] == 0 and locked["skipped"] is False and "error" in locked
    assert db.get_session("stale") is not None
    db.close()
    closed = db.maybe_auto_prune_and_vacuum()
    assert set(closed) == {"skipped", "pruned", "vacuumed", "error"} and "closed" in closed["error"]
    with SessionDB(db_path, read_only=True) as ro:
        assert "error" in ro.maybe_auto_prune_and_vacuum()


def test_a_failed_prune_leaves_the_next_start_due(db_path: Path) -> None:
    with SessionDB(db_path) as db:
        db.create_session("busy", "cli", started_at=NOW - 200 * DAY)
        db.end_session("busy", "user_exit")
        bad = db.maybe_auto_prune_and_vacuum(retention_days=-1)  # refused: negative
        assert "error" in bad and bad["pruned"] == 0
        assert db.get_meta("last_auto_prune") is None
        assert db.maybe_auto_prune_and_vacuum()["pruned"] == 1


def test_an_earlier_stamp_of_this_library_still_counts(db: SessionDB) -> None:
    db.set_meta("auto_prune_last_run_at", json.dumps(time.time()))
    assert db.maybe_auto_prune_and_vacuum()["skipped"] is True
