"""Undoing an interrupted import removes only what the import itself wrote. A gateway that
appended a turn to a session the import had already written, and created a delegate child under
it, keeps both, whether the import is undone at once (Ctrl-C) or by the next import (after
kill -9); the session is reported as kept."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import REPO_ROOT, subprocess_env
from hermes_state import SessionDB

# Sessions of the import, each published in its own transaction (``chunk_messages``).
SESSIONS, PER_SESSION = 12, 100
JOURNAL_SQL = "SELECT value FROM state_meta WHERE key LIKE 'import_in_progress:%'"

# Imports export argv[2] into store argv[1], one session per transaction; prints its report, or
# the notes of the interrupt that undid it.
IMPORTER = """
import json, sys
from hermes_state import SessionDB
with SessionDB(sys.argv[1], rebuild_fts=False) as db, open(sys.argv[2]) as fp:
    try:
        print(json.dumps(db.import_jsonl(fp, chunk_messages=int(sys.argv[3]))))
    except KeyboardInterrupt as exc:
        print("\\n".join(getattr(exc, "__notes__", [])), file=sys.stderr)
        sys.exit(130)
"""

# A gateway, already running: once told a session id on stdin, it appends a turn to that
# session of store argv[1] and creates a delegate child under it, then prints the turn's row id
# once both are acknowledged.
GATEWAY = """
import sys
from hermes_state import SessionDB
with SessionDB(sys.argv[1], rebuild_fts=False) as db:
    print("ready", flush=True)
    parent = sys.stdin.readline().strip()
    row = db.append_message(parent, "user", "a turn the gateway acknowledged")
    db.create_session(f"child-of-{parent}", "cli", parent_session_id=parent,
                      model_config={"_delegate_from": parent})
    print(row, flush=True)
"""


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the big export, a one-session export to run as "the next import")."""
    folder = tmp_path_factory.mktemp("undo")
    with SessionDB(folder / "source.db", rebuild_fts=False) as source:
        for s in range(SESSIONS):
            source.create_session(f"imp{s:02d}", "cli")
            source.replace_messages(f"imp{s:02d}", [
                {"role": "user" if m % 2 == 0 else "assistant",
                 "content": f"message {m} of session {s}"} for m in range(PER_SESSION)])
        source.create_session("next", "cli")
        source.append_message("next", "user", "the next import")
        big, small = folder / "big.jsonl", folder / "next.jsonl"
        big.write_text("".join(source.iter_export_jsonl([f"imp{s:02d}" for s in range(SESSIONS)])))
        small.write_text("".join(source.iter_export_jsonl(["next"])))
    return big, small


def journaled(path: Path) -> list[str]:
    """The sessions an unfinished import has written so far."""
    try:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            rows = conn.execute(JOURNAL_SQL).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return []
    return max((json.loads(v)["sessions"] for (v,) in rows), key=len, default=[])


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL])
def test_an_interrupted_import_keeps_what_others_wrote_into_it(
    exports: tuple[Path, Path], tmp_path: Path, spawn_python: Callable[..., subprocess.Popen[str]],
    seed: int, how: signal.Signals,
) -> None:
    big, small = exports
    target = tmp_path / "state.db"
    with SessionDB(target, rebuild_fts=False) as db:
        db.create_session("resident", "cli")
    rng = random.Random(seed)
    gateway = subprocess.Popen(
        [sys.executable, "-c", GATEWAY, str(target)], env=subprocess_env(), text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO_ROOT,
    )
    assert gateway.stdout is not None and gateway.stdin is not None
    assert gateway.stdout.readline() == "ready\n"
    importer = spawn_python(IMPORTER, str(target), str(big), str(PER_SESSION))
    deadline = time.monotonic() + 120
    while len(written := journaled(target)) < seed:
        assert importer.poll() is None, importer.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    touched = rng.choice(written)
    gateway.stdin.write(touched + "\n")
    gateway.stdin.flush()
    turn = int(gateway.stdout.readline())
    gateway.communicate(timeout=60)
    assert gateway.returncode == 0
    assert importer.poll() is None, "the import finished before it could be interrupted"
    importer.send_signal(how)
    _, err = importer.communicate(timeout=120)

    if how == signal.SIGINT:  # Ctrl-C: undone at once
        assert importer.returncode == 130, err
        assert f"{touched}: session child-of-{touched} was created under it" in err \
            or f"{touched}: written to by another writer" in err, err
    else:  # kill -9: undone by the next import
        assert importer.returncode == -signal.SIGKILL
        with SessionDB(target, rebuild_fts=False) as db, small.open() as fp:
            report = db.import_jsonl(fp)
        assert [k["session_id"] for k in report["abandoned_import_kept"]] == [touched]
        assert touched not in report.get("abandoned_import_removed", [])
        assert len(report.get("abandoned_import_removed", [])) >= seed - 1

    with SessionDB(target, read_only=True) as db:
        acked = [m for m in db.get_messages(touched) if m["id"] == turn]
        child = db.get_session(f"child-of-{touched}")
        assert len(acked) + (child is not None) == 2, "both acknowledged writes survive"
        assert child is not None and child["parent_session_id"] == touched
        assert len(db.get_messages(touched)) == PER_SESSION + 1, "the session is kept whole"
        others = {s["id"] for s in db.search_sessions(limit=-1)}
        assert others - {"resident", "next", touched, f"child-of-{touched}"} == set(), \
            "every other session the import wrote is gone"
    assert journaled(target) == []
