"""Imports are whole or nothing: a truncated, altered or malformed stream writes nothing, each
problem is named by its line or index, and a long import published in several short
transactions never starves other writers and leaves nothing behind when it is killed."""

from __future__ import annotations

import io
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import subprocess_env
from hermes_state import ImportRejectedError, InvalidInputError, SessionDB, Timing
from state_helpers import populate

REPO_ROOT = Path(__file__).resolve().parent.parent
BIG_SESSIONS, BIG_PER_SESSION = 80, 379  # the store: 30,320 messages
# Enough sessions, one per chunk, to kill an import at several points; small enough to import
# again in a second or two.
KILLED_SESSIONS, KILLED_PER_SESSION = 16, 120


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hermes_state_cli", *args], env=subprocess_env(), input=stdin,
        capture_output=True, text=True, timeout=180, cwd=REPO_ROOT,
    )


def stream_of(db: SessionDB) -> list[str]:
    return list(db.iter_export_jsonl())


def store_rows(path: Path) -> tuple[int, int]:
    """(sessions, messages) in the store at ``path``, read with plain SQLite."""
    if not path.exists():
        return (0, 0)
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return (conn.execute("SELECT count(*) FROM sessions").fetchone()[0],
                conn.execute("SELECT count(*) FROM messages").fetchone()[0])
    finally:
        conn.close()


def counters_agree(path: Path) -> bool:
    with SessionDB(path, read_only=True) as db:
        for session in db.search_sessions(limit=-1):
            live = [m for m in db.get_messages(session["id"]) if m["active"]]
            if session["message_count"] != len(live):
                return False
    return True


def write_export(home: Path, sessions: int, per_session: int) -> Path:
    """An export of ``sessions`` sessions of ``per_session`` messages, by the command line."""
    with SessionDB(home / "source.db") as db:
        for n in range(sessions):
            sid = f"big-{n:03d}"
            db.create_session(sid, "cli")
            db.replace_messages(sid, [
                {"role": "user" if i % 2 == 0 else "assistant",
                 "content": f"message {i} of {sid} about docker 東京"}
                for i in range(per_session)
            ])
    out = home / "all.jsonl"
    done = cli("--db", str(home / "source.db"), "sessions", "export", "-o", str(out))
    assert done.returncode == 0, done.stderr
    return out


@pytest.fixture(scope="module")
def big_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 30,320-message export (80 sessions of 379 messages)."""
    return write_export(tmp_path_factory.mktemp("big"), BIG_SESSIONS, BIG_PER_SESSION)


@pytest.fixture(scope="module")
def killed_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_export(tmp_path_factory.mktemp("killed"), KILLED_SESSIONS, KILLED_PER_SESSION)


# --- the stream's frame -----------------------------------------------------------------------


@pytest.mark.slow
def test_a_truncated_export_imports_nothing_and_the_whole_one_then_imports(
    big_export: Path, tmp_path: Path
) -> None:
    """The issue's reproduction: ``head -n 5000 all.jsonl`` of a 30,000-message export."""
    head = tmp_path / "head.jsonl"
    with big_export.open() as src:
        head.write_text("".join(line for _, line in zip(range(5000), src)))
    target = tmp_path / "target.db"
    cut = cli("--db", str(target), "sessions", "import", str(head))
    assert cut.returncode == 1, cut.stdout
    assert "end line" in cut.stderr and "Traceback" not in cut.stderr
    assert store_rows(target) == (0, 0)
    whole = cli("--db", str(target), "sessions", "import", str(big_export), "--json")
    assert whole.returncode == 0, whole.stderr
    assert json.loads(whole.stdout)["messages_imported"] == BIG_SESSIONS * BIG_PER_SESSION
    assert "importing messages" in whole.stderr  # progress, on stderr
    assert store_rows(target) == (BIG_SESSIONS, BIG_SESSIONS * BIG_PER_SESSION)
    assert counters_agree(target)


def _header(lines: list[str], **changes: Any) -> list[str]:
    header = json.loads(lines[0])
    header.update(changes)
    return [json.dumps(header) + "\n", *lines[1:]]


def _end(lines: list[str], **changes: Any) -> list[str]:
    end = json.loads(lines[-1])
    end.update(changes)
    return [*lines[:-1], json.dumps(end) + "\n"]


def _first(lines: list[str], kind: str) -> int:
    return next(i for i, line in enumerate(lines) if json.loads(line)["kind"] == kind)


ALTERED: dict[str, tuple[Callable[[list[str]], list[str]], str]] = {
    "format_version 2": (lambda ls: _header(ls, format_version=2), "format_version 2"),
    "schema_version 99": (lambda ls: _header(ls, schema_version=99), "newer store"),
    "another format": (lambda ls: _header(ls, format="other"), "not a hermes-state-export"),
    "no header": (lambda ls: ls[1:], "header"),
    "no end line": (lambda ls: ls[:-1], "end line"),
    "end counts one message more": (
        lambda ls: _end(ls, messages=json.loads(ls[-1])["messages"] + 1), "end line counts"),
    "a message line dropped": (
        lambda ls: ls[:_first(ls, "message")] + ls[_first(ls, "message") + 1:],
        "end line counts"),
    "a session line dropped": (
        lambda ls: ls[:_first(ls, "session")] + ls[_first(ls, "session") + 1:],
        "no session line"),
    "a line after the end": (lambda ls: [*ls, ls[1]], "after the end"),
    "a line that is not JSON": (lambda ls: [*ls[:3], '{"kind": "mess\n', *ls[3:]], "not a JSON"),
}


@pytest.mark.parametrize("case", sorted(ALTERED))
def test_a_stream_that_fails_any_check_writes_nothing(case: str, tmp_path: Path) -> None:
    with SessionDB(tmp_path / "a.db") as a:
        populate(a, sessions=3, messages=2)
        lines = stream_of(a)
    alter, reason = ALTERED[case]
    with SessionDB(tmp_path / "b.db") as b:
        with pytest.raises(ImportRejectedError, match=reason) as caught:
            b.import_jsonl(io.StringIO("".join(alter(lines))))
        assert all("line" in e for e in caught.value.errors if "session_id" in e)
        assert b.session_count() == 0 and b.message_count() == 0
        assert isinstance(caught.value, ValueError)  # callers' `except ValueError` still works


# --- bad records --------------------------------------------------------------------------------

BAD_RECORDS: dict[str, tuple[Any, str]] = {
    "messages [5]": ({"messages": [5]}, "message 0 must be an object"),
    "a dict title": ({"title": {"x": 1}}, "title must be "),
    "a 2^70 token count": ({"input_tokens": 2**70}, "64-bit"),
    "a 2^70 message token count": (
        {"messages": [{"role": "user", "content": "x", "token_count": 2**70}]}, "64 bits"),
    "a lone surrogate": ({"title": "bad \ud800"}, "surrogate"),
    "just a string": ("just a string", "must be an object"),
    "a list": ([1, 2, 3], "must be an object"),
    "more messages counted than held": ({"message_count": 379}, "truncated"),
}


def _good(sid: str) -> dict[str, Any]:
    return {"id": sid, "source": "cli", "started_at": 1000.0,
            "messages": [{"role": "user", "content": f"hello from {sid}"}]}


def _bad(case: str) -> Any:
    change, _ = BAD_RECORDS[case]
    return {**_good("bad"), **change} if isinstance(change, dict) else change


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_a_bad_record_is_reported_by_index_and_nothing_is_written(
    case: str, db: SessionDB
) -> None:
    result = db.import_sessions([_good("first"), _good("second"), _bad(case), _good("last")])
    _, reason = BAD_RECORDS[case]
    assert result["ok"] is False and result["imported"] == 0
    assert [e["index"] for e in result["errors"]] == [2]
    assert reason in result["errors"][0]["error"]
    assert db.session_count() == 0 and db.message_count() == 0


@pytest.mark.parametrize("case", ["messages [5]", "a dict title", "a 2^70 token count"])
def test_the_command_line_names_the_bad_line_and_imports_nothing(
    case: str, tmp_path: Path
) -> None:
    with SessionDB(tmp_path / "a.db") as a:
        populate(a, sessions=2, messages=1)
        lines = stream_of(a)
    change, reason = BAD_RECORDS[case]
    bad = {**_good("bad"), **change}
    messages = bad.pop("messages")
    extra = [json.dumps({"kind": "session", "session": bad}) + "\n"] + [
        json.dumps({"kind": "message", "session_id": "bad", "message": m}) + "\n"
        for m in messages
    ]
    lines = _end(lines[:-1] + extra + lines[-1:], sessions=3,
                 messages=json.loads(lines[-1])["messages"] + len(messages))
    target = tmp_path / "b.db"
    done = cli("--db", str(target), "sessions", "import", "-", stdin="".join(lines))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"line {len(lines) - len(extra)}" in done.stderr or "line" in done.stderr
    assert reason in done.stderr and "nothing was imported" in done.stderr
    assert not target.exists() and not list(tmp_path.glob("*b.db*"))


def test_an_import_into_a_new_file_creates_it_only_whole(tmp_path: Path) -> None:
    with SessionDB(tmp_path / "a.db") as a:
        populate(a, sessions=2, messages=3)
        lines = stream_of(a)
    target = tmp_path / "new" / "deeper" / "b.db"
    cut = cli("--db", str(target), "sessions", "import", "-", stdin="".join(lines[:-1]))
    assert cut.returncode == 1 and "nothing was imported" in cut.stderr
    assert not (tmp_path / "new").exists()  # nor the folders the import made for it
    whole = cli("--db", str(target), "sessions", "import", "-", stdin="".join(lines))
    assert whole.returncode == 0, whole.stderr
    assert [p.name for p in target.parent.iterdir()] == ["b.db"]
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert store_rows(target) == store_rows(tmp_path / "a.db")


def test_an_import_without_counters_computes_them(db: SessionDB) -> None:
    record = _good("s")
    record["messages"] += [
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}, {"id": "c2"}]},
        {"role": "user", "content": "rewound", "active": False},
    ]
    assert db.import_sessions([record])["ok"]
    session = db.get_session("s")
    assert (session["message_count"], session["tool_call_count"]) == (2, 2)


def test_a_parent_cycle_is_broken_and_counted_as_detached(db: SessionDB) -> None:
    a, b = _good("a"), _good("b")
    a["parent_session_id"], b["parent_session_id"] = "b", "a"
    orphan = {**_good("c"), "parent_session_id": "nowhere"}
    result = db.import_sessions([a, b, orphan])
    assert result["ok"] and result["imported"] == 3 and result["detached"] == 2
    parents = {s: db.get_session(s)["parent_session_id"] for s in ("a", "b", "c")}
    assert parents == {"a": None, "b": "a", "c": None}


def test_list_imports_keep_their_callers_limits(db: SessionDB) -> None:
    with pytest.raises(InvalidInputError, match="list"):
        db.import_sessions({"id": "x"})  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError, match="at most 500"):
        db.import_sessions([_good(f"s{n}") for n in range(501)])
    big = {**_good("big"), "messages": [{"role": "user", "content": "x"}] * 10_001}
    result = db.import_sessions([_good("small"), big])
    assert result["ok"] is False and result["errors"][0]["index"] == 1
    assert result["errors"][0]["error"] == "messages exceeds the per-session import limit"
    assert db.session_count() == 0
    assert db.import_sessions([_good("small"), big], limited=False)["imported"] == 2


def test_on_conflict_is_checked(db: SessionDB) -> None:
    with pytest.raises(InvalidInputError, match="on_conflict"):
        db.import_sessions([_good("s")], on_conflict="merge")


# --- long imports: short transactions, and killed ones leave nothing ----------------------------

JOURNAL_SQL = "SELECT value FROM state_meta WHERE key LIKE 'import_in_progress:%'"

# Imports argv[2] into argv[1] in chunks of argv[3] messages (the command line's own import).
IMPORTER = """
import sys
import hermes_state_transfer
hermes_state_transfer.PUBLISH_CHUNK_MESSAGES = int(sys.argv[3])
import hermes_state_cli
sys.exit(hermes_state_cli.main(["--db", sys.argv[1], "sessions", "import", sys.argv[2]]))
"""


def journal_sessions(path: Path) -> int:
    """How many sessions an unfinished import has written so far (0: none in progress)."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return 0
    try:
        rows = conn.execute(JOURNAL_SQL).fetchall()
    except sqlite3.Error:  # not created yet
        return 0
    finally:
        conn.close()
    return max((len(json.loads(v)["sessions"]) for (v,) in rows), default=0)


def wait_until(check: Callable[[], bool], proc: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


@pytest.fixture
def resident(tmp_path: Path) -> Iterator[Path]:
    """A store that already holds one session of its own."""
    target = tmp_path / "target.db"
    with SessionDB(target) as db:
        db.create_session("resident", "cli")
        db.append_message("resident", "user", "mine")
    yield target


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 4, 9])
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_an_import_killed_mid_way_leaves_nothing_once_the_next_import_runs(
    killed_export: Path, resident: Path, seed: int, how: signal.Signals
) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", IMPORTER, str(resident), str(killed_export),
         str(KILLED_PER_SESSION)],
        env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=REPO_ROOT,
    )
    wait_until(lambda: journal_sessions(resident) >= seed, proc, timeout=60)
    proc.send_signal(how)
    _, err = proc.communicate(timeout=60)
    if how == signal.SIGINT:
        # Ctrl-C: the import deletes what it wrote before it exits.
        assert proc.returncode == 130 and "interrupted" in err, err
        assert "Traceback" not in err
        assert store_rows(resident) == (1, 1) and journal_sessions(resident) == 0
    else:
        assert proc.returncode == -signal.SIGKILL
        assert journal_sessions(resident) >= seed
    again = cli("--db", str(resident), "sessions", "import", str(killed_export), "--json")
    assert again.returncode == 0, again.stderr
    report = json.loads(again.stdout)
    assert len(report["imported"]) == KILLED_SESSIONS
    if how == signal.SIGKILL:
        assert len(report["abandoned_import_removed"]) >= seed
    assert store_rows(resident) == (KILLED_SESSIONS + 1, KILLED_SESSIONS * KILLED_PER_SESSION + 1)
    assert journal_sessions(resident) == 0 and counters_agree(resident)


def staged_stores(folder: Path, name: str) -> list[Path]:
    """The stores an import into ``folder / name`` writes before it is whole."""
    return [p for p in folder.glob(f".{name}.hermes-partial-*")
            if not p.name.endswith(("-wal", "-shm", "-journal"))]


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 6])
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT])
def test_an_import_into_a_new_file_killed_mid_way_leaves_no_store_there(
    killed_export: Path, tmp_path: Path, seed: int, how: signal.Signals
) -> None:
    folder = tmp_path / "stores"
    folder.mkdir()
    target = folder / "new.db"
    proc = subprocess.Popen(
        [sys.executable, "-c", IMPORTER, str(target), str(killed_export),
         str(KILLED_PER_SESSION)],
        env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=REPO_ROOT,
    )
    wait_until(lambda: any(journal_sessions(p) >= seed for p in staged_stores(folder, "new.db")),
               proc, timeout=60)
    proc.send_signal(how)
    _, err = proc.communicate(timeout=60)
    assert not target.exists()
    if how == signal.SIGINT:
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert list(folder.iterdir()) == []
    else:
        assert proc.returncode == -signal.SIGKILL
        assert len(staged_stores(folder, "new.db")) == 1
    again = cli("--db", str(target), "sessions", "import", str(killed_export))
    assert again.returncode == 0, again.stderr
    assert [p.name for p in folder.iterdir()] == ["new.db"]  # what the killed one left: gone
    assert store_rows(target) == (KILLED_SESSIONS, KILLED_SESSIONS * KILLED_PER_SESSION)
    assert counters_agree(target)


@pytest.mark.parametrize("after_chunk", [1, 2, 5])
def test_ctrl_c_right_after_a_chunk_commits_still_deletes_that_chunk(
    killed_export: Path, resident: Path, after_chunk: int
) -> None:
    """The interrupt lands after a chunk's transaction has committed and before the import has
    gone on: what that chunk wrote is deleted with the rest."""
    commits: list[int] = []

    def interrupted_after_commit(done: int, total: int) -> None:
        commits.append(done)
        if len(commits) == after_chunk:
            raise KeyboardInterrupt

    with SessionDB(resident, timing=Timing(import_pause_s=0)) as db:
        with killed_export.open() as fp, pytest.raises(KeyboardInterrupt):
            db.import_jsonl(fp, chunk_messages=KILLED_PER_SESSION,
                            on_commit=interrupted_after_commit)
    assert commits == [KILLED_PER_SESSION * n for n in range(1, after_chunk + 1)]
    assert store_rows(resident) == (1, 1) and journal_sessions(resident) == 0


# Appends to argv[1] until its stdin closes, then prints the slowest append in seconds.
APPENDER = """
import sys, threading, time
from hermes_state import SessionDB
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
slowest = 0.0
with SessionDB(sys.argv[1]) as db:
    db.create_session("writer", "cli")
    print("ready", flush=True)
    n = 0
    while not stop.is_set():
        started = time.monotonic()
        db.append_message("writer", "user", f"turn {n}")
        slowest = max(slowest, time.monotonic() - started)
        n += 1
        time.sleep(0.005)
print(n, slowest, flush=True)
"""


@pytest.mark.slow
def test_other_writers_keep_writing_while_a_long_import_runs(
    big_export: Path, resident: Path
) -> None:
    writer = subprocess.Popen(
        [sys.executable, "-c", APPENDER, str(resident)], env=subprocess_env(),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=REPO_ROOT,
    )
    assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
    started = time.monotonic()
    done = cli("--db", str(resident), "sessions", "import", str(big_export))
    took = time.monotonic() - started
    out, err = writer.communicate("", timeout=60)
    assert done.returncode == 0, done.stderr
    assert writer.returncode == 0, err
    appended, slowest = out.split()
    assert int(appended) > 10
    # Each publish transaction is short: no append waited anywhere near its patience (20 s),
    # nor for more than a small part of the whole import.
    assert float(slowest) < min(3.0, took / 2), (slowest, took)


# --- exports appear whole; Ctrl-C anywhere leaves nothing behind -------------------------------


def partials(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".hermes-partial-" in p.name)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.3, 0.8])
def test_ctrl_c_during_an_export_leaves_no_partial_file(
    big_export: Path, tmp_path: Path, delay: float
) -> None:
    out = tmp_path / "out.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes_state_cli", "--db", str(big_export.parent / "source.db"),
         "sessions", "export", "-o", str(out)],
        env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=REPO_ROOT,
    )
    wait_until(lambda: bool(partials(tmp_path)), proc, timeout=60)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert partials(tmp_path) == [] and "Traceback" not in err, err
    if out.exists():
        # It finished first: the file is whole, whether the signal then found nothing to
        # interrupt (0), the command's last steps (130) or the interpreter on its way out,
        # past every handler (killed by SIGINT).
        assert json.loads(out.read_text().splitlines()[-1])["kind"] == "end"
        assert proc.returncode in (0, 130, -signal.SIGINT), err
        return
    assert proc.returncode == 130 and "interrupted" in err, err


@pytest.mark.slow
def test_ctrl_c_while_an_import_is_checked_writes_nothing_and_removes_its_spool(
    big_export: Path, resident: Path, tmp_path: Path
) -> None:
    spools = tmp_path / "tmp"
    spools.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hermes_state_cli", "--db", str(resident), "sessions", "import",
         str(big_export)],
        env=subprocess_env({"TMPDIR": str(spools)}), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=REPO_ROOT,
    )
    wait_until(lambda: any(spools.iterdir()), proc, timeout=60)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err, err
    assert store_rows(resident) == (1, 1) and list(spools.iterdir()) == []


def test_an_export_never_replaces_an_existing_file(tmp_path: Path) -> None:
    with SessionDB(tmp_path / "a.db") as a:
        populate(a, sessions=1, messages=1)
    out = tmp_path / "out.jsonl"
    out.write_text("mine\n")
    done = cli("--db", str(tmp_path / "a.db"), "sessions", "export", "-o", str(out))
    assert done.returncode == 1 and "exists" in done.stderr
    assert out.read_text() == "mine\n" and partials(tmp_path) == []


# --- what killed runs left is removed by the next run, and only that ----------------------------


def dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    return int(proc.stdout)


def leftovers(folder: Path, mark: str, *, as_dir: bool) -> tuple[Path, Path]:
    """A temporary entry of a process that is gone and one of this (live) process."""
    from hermes_state_files import temp_prefix

    mine = temp_prefix(mark)
    dead = mine.replace(f"{mark}{os.getpid()}.", f"{mark}{dead_pid()}.")
    made = []
    for prefix in (dead, mine):
        path = folder / f"{prefix}leftover"
        if as_dir:
            path.mkdir()
            (path / "spool.db").write_bytes(b"x" * 100)
        else:
            path.write_bytes(b"partial")
        made.append(path)
    return made[0], made[1]


def test_the_next_export_removes_partial_files_of_killed_exports_only(tmp_path: Path) -> None:
    with SessionDB(tmp_path / "a.db") as a:
        populate(a, sessions=1, messages=1)
    gone, live = leftovers(tmp_path, ".out.jsonl.hermes-partial-", as_dir=False)
    done = cli("--db", str(tmp_path / "a.db"), "sessions", "export", "-o",
               str(tmp_path / "out.jsonl"))
    assert done.returncode == 0, done.stderr
    assert not gone.exists() and live.exists()


def test_the_next_import_removes_spools_of_killed_imports_only(
    tmp_path: Path, resident: Path
) -> None:
    spools = tmp_path / "tmp"
    spools.mkdir()
    gone, live = leftovers(spools, "hermes-import-", as_dir=True)
    with SessionDB(tmp_path / "a.db") as a:
        populate(a, sessions=1, messages=1)
        stream = "".join(stream_of(a))
    done = subprocess.run(
        [sys.executable, "-m", "hermes_state_cli", "--db", str(resident), "sessions", "import",
         "-"], input=stream, env=subprocess_env({"TMPDIR": str(spools)}), capture_output=True,
        text=True, cwd=REPO_ROOT, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert not gone.exists() and live.exists()
    assert sorted(p.name for p in spools.iterdir()) == [live.name]


def test_the_next_recover_removes_work_copies_of_killed_recovers_only(tmp_path: Path) -> None:
    with SessionDB(tmp_path / "a.db") as a:
        populate(a, sessions=1, messages=1)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    gone, live = leftovers(out_dir, ".hermes-recover-", as_dir=True)
    done = cli("--db", str(tmp_path / "a.db"), "sessions", "recover", "--output",
               str(out_dir / "new.db"))
    assert done.returncode == 0, done.stderr
    assert not gone.exists() and live.exists()


# --- long work says how far it is, on stderr ------------------------------------------------------


def test_long_commands_print_progress_on_stderr_only(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    with SessionDB(db) as a:
        populate(a, sessions=3, messages=2)
    exported = cli("--db", str(db), "sessions", "export", "--format", "json")
    assert exported.returncode == 0 and "writing sessions 3/3" in exported.stderr
    assert len(json.loads(exported.stdout)) == 3
    stream = cli("--db", str(db), "sessions", "export").stdout
    imported = cli("--db", str(tmp_path / "b.db"), "sessions", "import", "-", stdin=stream)
    assert imported.returncode == 0 and "checked messages" in imported.stderr
    assert "checking" not in imported.stdout
    doctor = cli("--db", str(db), "doctor", "--full", "--json")
    assert json.loads(doctor.stdout)["health"]["healthy"] is True
    assert "hermes-state:" in doctor.stderr
