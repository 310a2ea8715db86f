"""Fault injection with real processes and real files: a lock storm of writer processes with a
checkpointer and a reader beside them, foreign lock holders, kill -9 at random moments, a full
disk and a file-size limit, and hostile input in every field.

Nothing here mocks SQLite. Patience constants are shortened inside the child processes (they
are module attributes on purpose) so the suite stays fast.
"""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import hermes_state
import hermes_state_common as common
import hermes_state_connect as dbconn
import hermes_state_fts as fts
import hermes_state_lockowners as lockowners
import hermes_state_writes as writes
from conftest import rest_of_output
from hermes_state import (
    ProfileStoreRegistry,
    SessionDB,
    StateDbFullError,
    StateDbLockedError,
    Timing,
    UnsafePathError,
    resolve_profile_home,
)
from hermes_state_errors import SQLITE_FULL
from state_helpers import Connections, raw

CLEAN_FTS = {"messages_fts": None, "messages_fts_trigram": None, "messages_fts_cjk": None}


def integrity(db_path: Path) -> list[str]:
    conn = sqlite3.connect(f"{db_path.as_uri()}?mode=ro", uri=True)
    try:
        return [row[0] for row in conn.execute("PRAGMA integrity_check")]
    finally:
        conn.close()


def assert_counters_match_rows(db: SessionDB) -> None:
    """Every session's counters equal what its rows say (they move in one transaction)."""
    for session in db.search_sessions(limit=-1):
        rows = db.get_messages(session["id"])
        assert session["message_count"] == len(rows), session["id"]
        calls = sum(len(row["tool_calls"] or ()) for row in rows if row["role"] == "assistant")
        assert session["tool_call_count"] == calls, session["id"]


def assert_healthy(db: SessionDB) -> None:
    assert integrity(db.path) == ["ok"]
    assert db.check_fts_integrity() == CLEAN_FTS
    assert_counters_match_rows(db)


# ---------------------------------------------------------------------------------------------
# A lock storm: writer processes, a checkpointer and a reader on one file
# ---------------------------------------------------------------------------------------------

# Appends argv[4] messages tagged argv[2] to session argv[3] of argv[1]: once its store is open
# it creates the file argv[5] + ".ready", then starts when the file argv[5] appears. A fifth of
# the messages carry a tool call, every tenth also moves the token counters. Prints one JSON
# line: the acknowledged row ids in order, lock retries, seconds spent, and how late after the
# start signal it began.
_WRITER = """
import json, os, sys, time
from hermes_state import SessionDB
path, tag, session, count, go = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), \\
    sys.argv[5]
db = SessionDB(path)
open(go + f".{tag}.ready", "w").close()
while not os.path.exists(go):
    time.sleep(0.002)
late = time.time() - os.stat(go).st_mtime
began = time.monotonic()
ids = []
for i in range(count):
    calls = [{"id": f"{tag}-{i}", "type": "function",
              "function": {"name": "probe", "arguments": "{}"}}] if i % 5 == 0 else None
    role = "assistant" if calls else "user"
    ids.append(db.append_message(session, role, f"{tag} storm {i} mark{tag}", tool_calls=calls))
    if i % 10 == 0:
        db.update_token_counts(session, input_tokens=1, model="m")
elapsed = time.monotonic() - began
print(json.dumps({"ids": ids, "retries": db.write_retries, "elapsed": elapsed, "late": late}),
      flush=True)
db.close()
"""

# Once its store is open it creates the file argv[3]; then, until argv[2] exists (at least
# once): a checkpoint and a search on argv[1] every 50 ms. Prints the counts.
_CHECKPOINTER = """
import json, os, sys, time
from hermes_state import SessionDB
db = SessionDB(sys.argv[1])
open(sys.argv[3], "w").close()
checkpoints = searches = incomplete = 0
while checkpoints == 0 or not os.path.exists(sys.argv[2]):
    busy, frames, copied = db.checkpoint()
    checkpoints += 1
    incomplete += bool(busy or copied < frames)
    db.search_messages("storm", limit=5)
    searches += 1
    time.sleep(0.05)
print(json.dumps({"checkpoints": checkpoints, "incomplete": incomplete, "searches": searches,
                  "retries": db.write_retries}), flush=True)
db.close()
"""

# Once open it creates the file argv[3]; then, until argv[2] exists (at least once): a
# read-only handle lists sessions and reads one of them. Prints counts.
_READER = """
import json, os, sys
from hermes_state import SessionDB
db = SessionDB(sys.argv[1], read_only=True)
open(sys.argv[3], "w").close()
reads = 0
while reads == 0 or not os.path.exists(sys.argv[2]):
    listed = db.list_sessions_rich(limit=50)
    for row in listed[:2]:
        messages = db.get_messages(row["id"])
        assert len(messages) <= db.get_session(row["id"])["message_count"]
    reads += 1
print(json.dumps({"reads": reads}), flush=True)
db.close()
"""


def _session_of(writer: int) -> str:
    return f"own-{writer}" if writer % 2 == 0 else "shared"


@pytest.mark.parametrize("writers", [4, 8])
def test_a_lock_storm_loses_nothing_and_leaks_no_error(
    db: SessionDB, spawn_python, tmp_path: Path, writers: int, record_property
) -> None:
    per_writer = 250
    for n in range(writers):
        db.create_session(_session_of(n), "cli")
    stop = tmp_path / "stop"
    side = [spawn_python(script, str(db.path), str(stop), str(tmp_path / f"{name}.ready"))
            for name, script in (("checkpointer", _CHECKPOINTER), ("reader", _READER))]
    go = tmp_path / "go"
    procs = [
        spawn_python(_WRITER, str(db.path), f"w{n}", _session_of(n), str(per_writer), str(go))
        for n in range(writers)
    ]
    ready = [tmp_path / f"go.w{n}.ready" for n in range(writers)]
    ready += [tmp_path / "checkpointer.ready", tmp_path / "reader.ready"]
    deadline = time.monotonic() + 120
    while not all(r.exists() for r in ready):  # every process is up and open
        assert time.monotonic() < deadline, "the processes did not open the store"
        assert all(p.poll() is None for p in procs + side), "one ended before the start"
        time.sleep(0.01)
    go.touch()
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "Traceback" not in err
        reports.append(json.loads(out.splitlines()[-1]))
    stop.touch()
    side_reports = []
    for proc in side:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        side_reports.append(json.loads(out.splitlines()[-1]))

    assert all(r["late"] < 0.5 for r in reports), reports  # they really ran at once
    for n, report in enumerate(reports):
        stored = [m for m in db.get_messages(_session_of(n)) if m["content"].startswith(f"w{n} ")]
        assert [m["id"] for m in stored] == report["ids"]  # all there, in the writer's order
        assert [m["content"] for m in stored] == [
            f"w{n} storm {i} markw{n}" for i in range(per_writer)]
    assert db.message_count() == writers * per_writer
    assert_healthy(db)
    for n in range(writers):
        hits = db.search_messages(f"markw{n}", limit=per_writer + 10)
        assert len(hits) == per_writer
    checkpointer, reader = side_reports
    assert checkpointer["checkpoints"] > 0 and checkpointer["searches"] > 0
    assert reader["reads"] > 0

    wall = max(r["elapsed"] for r in reports)
    rate = writers * per_writer / wall
    retries = sum(r["retries"] for r in reports)
    record_property("rows_per_second", round(rate))
    record_property("writer_retries", retries)
    print(f"\n{writers} writers x {per_writer}: {rate:.0f} rows/s over {wall:.1f} s, "
          f"{retries} lock retries by writers, {checkpointer['retries']} by the checkpointer, "
          f"{checkpointer['checkpoints']} checkpoints ({checkpointer['incomplete']} incomplete), "
          f"{reader['reads']} reader rounds")


# ---------------------------------------------------------------------------------------------
# A foreign process holding the write lock
# ---------------------------------------------------------------------------------------------

# Appends one message to argv[1] with the transcript patience shortened to argv[2] seconds and
# WARNINGs of the hermes_state logger on stderr; prints what happened as one JSON line.
_PATIENT_WRITER = """
import json, logging, sys, time
from hermes_state import SessionDB, StateDbLockedError, Timing
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s")
timing = Timing(transcript_patience_s=float(sys.argv[2]))
db = SessionDB(sys.argv[1], rebuild_fts=False, timing=timing)
began = time.monotonic()
try:
    db.append_message("s", "user", "patient")
    result = {"ok": True}
except StateDbLockedError as exc:
    result = {"ok": False, "reason": exc.reason, "holders": exc.holders,
              "cause": exc.__cause__.sqlite_errorcode}
result["waited"] = time.monotonic() - began
print(json.dumps(result), flush=True)
db.close()
"""


@pytest.fixture
def store_with_session(db_path: Path) -> Path:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
    return db_path


def test_a_foreign_holder_past_the_patience_is_named_in_the_warning_and_the_log(
    store_with_session: Path, hold_write_lock, run_python, hermes_home: Path
) -> None:
    with hold_write_lock(store_with_session) as holder:
        done = run_python(_PATIENT_WRITER, str(store_with_session), "0.4")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["ok"] is False
    assert result["reason"] == "session_persistence_failed:locked"
    assert result["cause"] & 0xFF == 5  # SQLITE_BUSY
    assert 0.4 <= result["waited"] < 0.4 + 2.5
    if not os.path.exists(lockowners.PROC_LOCKS_PATH):
        pytest.skip("no /proc/locks here: holders cannot be named")
    line = f"PID {holder.pid} ("
    named = [h for h in result["holders"] if h.startswith(line)]
    assert any("holds WAL write lock on state.db-shm" in h for h in named), result["holders"]
    warnings = [w for w in done.stderr.splitlines() if w.startswith("WARNING hermes_state ")]
    assert len(warnings) == 1 and line in warnings[0] and "WAL write lock" in warnings[0]
    log = (hermes_home / "logs" / "errors.log").read_text().splitlines()
    assert len(log) == 1
    assert "database is locked" in log[0] and line in log[0] and "WAL write lock" in log[0]
    with SessionDB(store_with_session) as db:
        assert db.get_messages("s") == []  # nothing half-written


@pytest.mark.parametrize("hold_s", [0.3, 1.2])
def test_a_foreign_hold_shorter_than_the_patience_is_waited_out(
    store_with_session: Path, hold_write_lock, run_python, hermes_home: Path, hold_s: float
) -> None:
    with hold_write_lock(store_with_session, seconds=hold_s):
        done = run_python(_PATIENT_WRITER, str(store_with_session), "3.0")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["ok"] is True and result["waited"] < 3.0
    assert "WARNING" not in done.stderr
    assert not (hermes_home / "logs" / "errors.log").exists()
    with SessionDB(store_with_session) as db:
        assert [m["content"] for m in db.get_messages("s")] == ["patient"]
        assert db.get_session("s")["message_count"] == 1


def test_without_a_lock_table_the_locked_error_still_comes_typed_and_logged(
    store_with_session: Path,
    hold_write_lock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    hermes_home: Path,
    tmp_path: Path,
) -> None:
    monkeypatch.setenv(lockowners.PROC_LOCKS_ENV, str(tmp_path / "no-such-lock-table"))
    caplog.set_level(logging.WARNING, logger="hermes_state")
    impatient = Timing(write_patience_s=0.2)
    with SessionDB(store_with_session, timing=impatient) as db, hold_write_lock(store_with_session):
        assert fts.other_processes_hold(store_with_session)  # nothing provable without it
        with pytest.raises(StateDbLockedError) as caught:
            db.set_meta("k", "v")
    assert caught.value.reason == "session_persistence_failed:locked"
    assert caught.value.holders == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("no lock holder could be named" in w for w in warnings)
    assert "no lock holder could be named" in (hermes_home / "logs" / "errors.log").read_text()


# ---------------------------------------------------------------------------------------------
# kill -9 at random moments
# ---------------------------------------------------------------------------------------------

# Appends to session argv[2] of argv[1] forever (checkpointing every 50 writes as any handle
# does), printing each row id once append_message returned it, then moving the counters.
_FOREVER = """
import sys
from hermes_state import SessionDB
db = SessionDB(sys.argv[1])
i = 0
while True:
    calls = [{"id": str(i), "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    row_id = db.append_message(sys.argv[2], "assistant", f"kill test {i} " + "z" * (i % 700),
                               tool_calls=calls if i % 3 == 0 else None)
    print(row_id, flush=True)
    db.update_token_counts(sys.argv[2], input_tokens=1, model="m")
    i += 1
"""


@pytest.mark.parametrize("seed", range(5))
def test_kill_9_at_a_random_moment_loses_no_acknowledged_row(
    db: SessionDB, spawn_python, seed: int
) -> None:
    rng = random.Random(seed)
    for name in ("victim", "survivor"):
        db.create_session(name, "cli")
    victim = spawn_python(_FOREVER, str(db.path), "victim")
    survivor = spawn_python(_FOREVER, str(db.path), "survivor")
    assert victim.stdout is not None and survivor.stdout is not None
    acknowledged = [int(victim.stdout.readline())]
    time.sleep(rng.uniform(0.05, 1.2))
    victim.send_signal(signal.SIGKILL)
    out, _ = rest_of_output(victim, timeout=10)
    acknowledged += [int(line) for line in out.split()]
    survivor.send_signal(signal.SIGKILL)
    out, _ = survivor.communicate(timeout=10)

    assert set(acknowledged) <= {m["id"] for m in db.get_messages("victim")}
    assert {int(line) for line in out.split()} <= {m["id"] for m in db.get_messages("survivor")}
    assert integrity(db.path) == ["ok"]
    assert_counters_match_rows(db)
    assert db.check_fts_integrity() == CLEAN_FTS
    with SessionDB(db.path) as fresh:
        row = fresh.append_message("victim", "user", "the store carries on")
        assert fresh.get_messages("victim")[-1]["id"] == row


# ---------------------------------------------------------------------------------------------
# A full disk
# ---------------------------------------------------------------------------------------------


def test_a_full_database_refuses_the_whole_write_and_takes_writes_again_later(
    db: SessionDB, connections: Connections,
) -> None:
    db.create_session("s", "cli")
    db.append_message("s", "user", "before")
    # max_page_count belongs to a connection: set it on the handle's own.
    own = connections.own()
    pages = own.execute("PRAGMA page_count").fetchone()[0]
    own.execute(f"PRAGMA max_page_count = {pages + 8}").fetchone()
    stored = 1
    with pytest.raises(StateDbFullError) as full:
        for n in range(1000):
            db.append_message("s", "assistant", f"filler {n} " + "f" * 3000,
                              tool_calls=[{"id": str(n)}])
            stored += 1
    assert full.value.__cause__.sqlite_errorcode & 0xFF == SQLITE_FULL
    assert not db.quarantined
    assert len(db.get_messages("s")) == stored  # the failing row is not there, half or whole
    assert_counters_match_rows(db)

    own.execute("PRAGMA max_page_count = 1073741823").fetchone()
    db.append_message("s", "user", "space is back", tool_calls=[{"id": "x"}])
    assert len(db.get_messages("s")) == stored + 1
    assert_healthy(db)


# In a child limited to argv[2] more bytes per file (RLIMIT_FSIZE, SIGXFSZ ignored): appends
# until a typed error, checks nothing was half-written, lifts the limit and appends again.
_FILE_SIZE_LIMIT = """
import json, os, resource, signal, sys
from hermes_state import SessionDB, StateDbFullError, StateDbIOError
db = SessionDB(sys.argv[1])
db.checkpoint()
largest = max(os.path.getsize(sys.argv[1] + s) for s in ("", "-wal"))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (largest + int(sys.argv[2]), resource.RLIM_INFINITY))
written = 0
try:
    while True:
        db.append_message("s", "user", "g" * 5000)
        written += 1
except (StateDbFullError, StateDbIOError) as exc:
    error = type(exc).__name__
resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
rows = len(db.get_messages("s"))
counted = db.get_session("s")["message_count"]
db.append_message("s", "user", "after the limit")
print(json.dumps({"error": error, "written": written, "rows": rows, "counted": counted,
                  "after": len(db.get_messages("s"))}), flush=True)
db.close()
"""


def test_a_file_size_limit_gives_a_typed_error_and_no_half_write(
    store_with_session: Path, run_python
) -> None:
    done = run_python(_FILE_SIZE_LIMIT, str(store_with_session), "150000")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["error"] in ("StateDbFullError", "StateDbIOError")
    assert result["written"] > 0
    assert result["rows"] == result["counted"] == result["written"]
    assert result["after"] == result["written"] + 1
    with SessionDB(store_with_session) as db:
        assert_healthy(db)


# ---------------------------------------------------------------------------------------------
# Hostile input
# ---------------------------------------------------------------------------------------------

# Lone surrogates (SQLite cannot bind them: they are removed), NUL (kept), quotes and SQL.
HOSTILE = "a\x00b\ud800c\udfffd'); DROP TABLE sessions; --\"]`%_\\"
CLEANED = common.clean_text(HOSTILE)

_SESSION_TEXT = (
    "user_id", "model", "system_prompt", "billing_provider", "billing_base_url", "billing_mode",
    "cost_status", "cost_source", "pricing_version", "session_key", "chat_id", "chat_type",
    "thread_id", "display_name", "cwd", "git_branch", "git_repo_root", "profile_name",
    "transport_profile",
)
_MESSAGE_TEXT = (
    "content", "tool_name", "tool_call_id", "finish_reason", "reasoning", "reasoning_content",
    "platform_message_id", "effect_disposition", "api_content", "display_kind",
)


def schema_of(db: SessionDB) -> list[tuple[Any, ...]]:
    with raw(db.db_path) as conn:
        return conn.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def test_surrogates_nul_and_sql_in_every_text_field_round_trip_as_data(
    db: SessionDB, connections: Connections
) -> None:
    schema = schema_of(db)
    identifiers: list[str] = []

    def authorizer(action: int, arg1: Any, arg2: Any, db_name: Any, source: Any) -> int:
        identifiers.extend(str(a) for a in (arg1, arg2) if a is not None)
        return sqlite3.SQLITE_OK

    connections.own().set_authorizer(authorizer)
    sid = "sess" + CLEANED  # an id cannot lose characters silently: see the next test
    db.create_session(sid, HOSTILE, model_config={HOSTILE: HOSTILE}, title="T" + HOSTILE,
                      **{k: HOSTILE for k in _SESSION_TEXT if k != "model"},
                      model=HOSTILE)
    row_id = db.append_message(
        sid, "user", **{k: HOSTILE for k in _MESSAGE_TEXT},
        tool_calls=[{"id": HOSTILE, "function": {"name": HOSTILE, "arguments": HOSTILE}}],
        reasoning_details=[{"text": HOSTILE}], display_metadata={HOSTILE: [HOSTILE]},
    )
    db.set_meta(HOSTILE, HOSTILE)
    db.end_session(sid, HOSTILE)
    connections.own().set_authorizer(None)

    assert not any(HOSTILE[:3] in name or "DROP" in name for name in identifiers)
    assert schema_of(db) == schema
    session = db.get_session(sid)
    assert session is not None
    for key in ("source", "end_reason", *_SESSION_TEXT):
        assert session[key] == CLEANED, key
    assert json.loads(session["model_config"]) == {CLEANED: CLEANED}
    assert session["title"] == SessionDB.sanitize_title("T" + HOSTILE)
    (message,) = db.get_messages(session["id"])
    assert message["id"] == row_id
    for key in _MESSAGE_TEXT:
        assert message[key] == CLEANED, key
    assert message["tool_calls"][0]["function"]["arguments"] == CLEANED
    assert message["display_metadata"] == {CLEANED: [CLEANED]}
    assert db.get_meta(CLEANED) == CLEANED
    assert db.resolve_session_id(session["id"]) == session["id"]
    assert db.search_messages(HOSTILE) is not None  # never raises
    assert_healthy(db)


def test_a_session_id_with_a_lone_surrogate_is_refused_not_mangled(db: SessionDB) -> None:
    with pytest.raises(ValueError):
        db.create_session("s\ud800", "cli")
    assert db.get_session("s\ud800") is None and db.get_session("s") is None
    assert db.resolve_session_id("s\ud800") is None


def test_a_10_mb_message_is_stored_read_back_and_found(db: SessionDB) -> None:
    db.create_session("big", "cli")
    words = [f"w{n:06d}" for n in range(1_400_000)]
    words[700_000] = "needleinthehaystack"
    content = " ".join(words)[: 10 * 1024 * 1024]
    assert len(content) >= 10 * 1024 * 1024 - 1
    row_id = db.append_message("big", "tool", content, tool_name="dump")
    (stored,) = db.get_messages("big")
    assert stored["id"] == row_id and stored["content"] == content
    assert [hit["id"] for hit in db.search_messages("needleinthehaystack")] == [row_id]


def test_filter_lists_longer_than_the_parameter_limit_are_honoured(db: SessionDB) -> None:
    n = 40_000  # beyond SQLite's 32,766 bound parameters
    for source in ("cli", "telegram", "discord"):
        db.create_session(f"s-{source}", source)
        db.append_message(f"s-{source}", "user", f"filtered {source}")
        db.append_message(f"s-{source}", "assistant", f"filtered {source} reply")
    many = [f"src{i}" for i in range(n)]

    def found(**filters: Any) -> set[tuple[str, str]]:
        return {(h["source"], h["role"]) for h in db.search_messages("filtered", **filters)}

    assert found(source_filter=[*many, "cli"]) == {("cli", "user"), ("cli", "assistant")}
    assert found(exclude_sources=[*many, "cli", "discord"]) == {
        ("telegram", "user"), ("telegram", "assistant")}
    assert found(role_filter=[*many, "assistant"]) == {
        (s, "assistant") for s in ("cli", "telegram", "discord")}
    assert found(source_filter=many) == set()
    listed = db.list_sessions_rich(exclude_sources=[*many, "telegram"], limit=10)
    assert {row["id"] for row in listed} == {"s-cli", "s-discord"}


def test_like_wildcards_are_literal_in_ids_prefixes_titles_and_queries(db: SessionDB) -> None:
    for sid in ("a%b", "a_c", "a\\d", "abc", "aXc"):
        db.create_session(sid, "cli")
    assert db.resolve_session_id("a%") == "a%b"
    assert db.resolve_session_id("a_") == "a_c"
    assert db.resolve_session_id("a\\") == "a\\d"
    assert db.resolve_session_id("a") is None  # five candidates
    assert db.resolve_session_id("%") is None and db.resolve_session_id("_") is None

    db.set_session_title("abc", "50% off")
    db.set_session_title("aXc", "50_ off")
    assert db.get_session_by_title("50% off")["id"] == "abc"
    assert db.get_next_title_in_lineage("50% off") == "50% off #2"
    db.set_session_title("a%b", "50% off #2")
    assert db.get_next_title_in_lineage("50_ off") == "50_ off #2"  # "50% off #2" is not its

    db.append_message("abc", "user", "rate is 100% and a_b and c\\d")
    db.append_message("aXc", "user", "rate is 1000 and axb and cxd")  # what wildcards match
    queries = ("100%", "a_b", "c\\d", "%", "_", "\\")
    for query in queries:  # from the index: whatever the sanitizer keeps, never the other row
        assert {h["session_id"] for h in db.search_messages(query)} <= {"abc"}, query
    db.set_meta(fts.STALE_KEY, "{}")  # and from the LIKE fallback over canonical rows
    for query in queries:
        found = [h["session_id"] for h in db.search_messages(query)]
        assert found == ["abc"] if len(query) > 1 else found in ([], ["abc"]), query


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "../x", "a/b", "a\\b", "/abs", "x\x00y", "-rf", ".hidden", "é", "a" * 65,
     "a..b", " ", "con/../x"],
)
def test_hostile_profile_names_are_refused_before_anything_is_created(
    hermes_home: Path, name: str
) -> None:
    before = sorted(p.relative_to(hermes_home.parent) for p in hermes_home.parent.rglob("*"))
    with pytest.raises(UnsafePathError):
        resolve_profile_home(name)
    registry: ProfileStoreRegistry[SessionDB] = ProfileStoreRegistry(SessionDB)
    with pytest.raises(UnsafePathError):
        registry.acquire(name, owner=object())
    after = sorted(p.relative_to(hermes_home.parent) for p in hermes_home.parent.rglob("*"))
    assert after == before


@pytest.mark.parametrize("where", ["state.db", "state.db-wal", "state.db-shm"])
@pytest.mark.parametrize("read_only", [False, True])
def test_a_dangling_symlink_at_the_default_database_path_is_refused(
    hermes_home: Path, tmp_path: Path, where: str, read_only: bool
) -> None:
    if where != "state.db" or read_only:
        SessionDB().close()  # a real store, with a planted sidecar beside it
        (hermes_home / where).unlink(missing_ok=True)
    target = tmp_path / "elsewhere" / "victim"
    (hermes_home / where).symlink_to(target)
    with pytest.raises(UnsafePathError):
        SessionDB(read_only=read_only)
    assert not target.exists() and not target.parent.exists()
    assert (hermes_home / where).is_symlink()


# ---------------------------------------------------------------------------------------------
# The WAL-reset mitigation, on both sides of the bug range
# ---------------------------------------------------------------------------------------------


@pytest.fixture(params=[True, False], ids=["exposed", "fixed"])
def exposure(request: pytest.FixtureRequest) -> bool:
    """This SQLite is inside the bug range; "fixed" opens the handles with
    ``wal_reset_exposed=False``."""
    if request.param and not dbconn.wal_reset_exposed():
        pytest.skip(f"SQLite {sqlite3.sqlite_version} is outside the WAL-reset bug range")
    return bool(request.param)


def test_every_connection_and_every_checkpoint_follows_the_exposure(
    db_path: Path, exposure: bool
) -> None:
    with SessionDB(db_path) as seed:
        seed.create_session("s", "cli")
    connections = Connections()
    db = SessionDB(db_path, on_connect=connections, wal_reset_exposed=exposure)
    assert db.wal_reset_exposed is exposure
    trace = connections.trace
    trace.clear()
    checkpoint = ("helper" if exposure else "handle", writes.CHECKPOINT_SQL)

    def one_checkpoint_in(taken: list[tuple[str, str]]) -> None:
        assert [s for s in taken if "wal_checkpoint" in s[1]] == [checkpoint], taken
        at = taken.index(checkpoint)
        handle = [sql for who, sql in taken[:at] if who == "handle"]
        if exposure:  # inside the handle's own write transaction
            assert taken[at - 1] == ("handle", "BEGIN IMMEDIATE")
            assert taken[at + 1] == ("handle", "COMMIT")
        else:  # between the handle's transactions
            assert handle.count("BEGIN IMMEDIATE") == handle.count("COMMIT")

    for n in range(db.timing.checkpoint_every):  # the every-50-writes one
        db.append_message("s", "user", f"m{n}")
        if any("wal_checkpoint" in sql for _, sql in trace):
            break
    one_checkpoint_in(trace)
    trace.clear()
    db.checkpoint()  # the explicit one
    one_checkpoint_in(trace)
    trace.clear()
    db.close()  # the one on close
    one_checkpoint_in(trace)

    expected = 0 if exposure else 1000
    # the helper, only where it is needed
    assert [role for role, _ in connections.opened] == (
        ["handle", "helper"] if exposure else ["handle"])
    opened = Connections(trace=False)
    with SessionDB(db_path, on_connect=opened, wal_reset_exposed=exposure) as writable, \
            SessionDB(db_path, read_only=True, on_connect=opened,
                      wal_reset_exposed=exposure) as reader:
        writable.checkpoint()
        roles = [role for role, _ in opened.opened]
        assert roles == (["handle", "handle", "helper"] if exposure else ["handle", "handle"])
        assert reader.read_only
        for _, conn in opened.opened:
            assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == expected


def test_a_quarantined_handle_runs_no_checkpoint_either_way(
    db_path: Path, exposure: bool, damage_messages_table: Callable[[Path], None]
) -> None:
    with SessionDB(db_path) as seed:
        seed.create_session("s", "cli")
        seed.append_message("s", "user", "x")
    damage_messages_table(db_path)
    connections = Connections()
    with SessionDB(db_path, on_connect=connections, wal_reset_exposed=exposure) as db:
        with pytest.raises(hermes_state.StateDbCorruptError):
            db.append_message("s", "user", "y")
    assert not any("wal_checkpoint" in sql for _, sql in connections.trace)
