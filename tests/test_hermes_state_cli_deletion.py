"""``sessions prune`` and ``sessions delete`` say what they will delete and ask first: the list
(``--dry-run``, with ``--json`` too) is exactly what goes, a terminal is asked and only a yes
deletes, ``--yes`` skips the question, and a stdin that is not a terminal refuses.

Every case runs the command line in a subprocess on a real store; the question is answered
through a pseudo-terminal; what was deleted is read back from the file."""

from __future__ import annotations

import json
import os
import pty
import random
import select
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from conftest import subprocess_env
from hermes_state import SessionDB

REPO_ROOT = Path(__file__).resolve().parent.parent
DAY = 86400.0
CLI = [sys.executable, "-m", "hermes_state_cli"]


def cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], env=subprocess_env({"COLUMNS": "120"}), input=stdin,
                          capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)


def as_json(result: subprocess.CompletedProcess[str]) -> Any:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _read_until(fd: int, marker: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise AssertionError(f"no {marker!r} on the terminal; it showed {seen!r}")
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # the other end closed: the command exited
            chunk = b""
        if not chunk:
            raise AssertionError(f"the command exited before {marker!r}; it showed {seen!r}")
        seen += chunk
    return seen


def on_terminal(
    *args: str, answer: str | None, meanwhile: Callable[[], None] | None = None
) -> tuple[int, str, str]:
    """Run the command with stdin and stderr on a pseudo-terminal, wait for its question,
    run ``meanwhile``, then type ``answer`` and Enter (None: end of input, Ctrl-D).
    Returns the exit status, stdout and what the terminal showed."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([*CLI, *args], stdin=slave, stdout=subprocess.PIPE, stderr=slave,
                            env=subprocess_env({"COLUMNS": "120"}), cwd=REPO_ROOT)
    os.close(slave)
    try:
        screen = _read_until(master, b"[y/N] ", 60)
        if meanwhile is not None:
            meanwhile()
        os.write(master, b"\x04" if answer is None else answer.encode() + b"\n")
        out, _ = proc.communicate(timeout=60)
        while select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            screen += chunk
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    return proc.returncode, out.decode(), screen.decode(errors="replace")


def aged_store(db_path: Path, seed: int) -> dict[str, Any]:
    """Sessions last active 1 to 400 days ago, ended or not; a compression chain whose ended
    root is old but whose tip is live; an old session never ended; an old ended session with
    live work. Returns every id and, for a 90-day prune, the ids that must go."""
    rng = random.Random(seed)
    now = time.time()
    ids, doomed = [], set()
    with SessionDB(db_path) as db:
        for n in range(16):
            sid = f"s{n:02d}-{rng.randrange(16**6):06x}"
            age = rng.choice([1, 30, 89, 91, 200, 400]) + rng.random() / 2
            db.create_session(sid, rng.choice(["cli", "telegram"]), started_at=now - age * DAY)
            db.set_session_title(sid, rng.choice(["東京タワーの設計", "deploy notes", "ok"])
                                 + f" {n}")
            for i in range(rng.randint(1, 4)):
                db.append_message(sid, "user", f"m{i}", timestamp=now - age * DAY + i)
            if rng.random() < 0.75:
                db.end_session(sid, "user_exit")
                if age > 90:
                    doomed.add(sid)
            ids.append(sid)
        db.create_session("chain-root", "cli", started_at=now - 300 * DAY)
        db.append_message("chain-root", "user", "old", timestamp=now - 300 * DAY)
        db.end_session("chain-root", "compression")
        db.create_session("chain-tip", "cli", parent_session_id="chain-root")
        db.append_message("chain-tip", "user", "still going")
        db.create_session("old-open", "cli", started_at=now - 200 * DAY)
        db.append_message("old-open", "user", "never ended", timestamp=now - 200 * DAY)
        db.create_session("busy", "cli", started_at=now - 300 * DAY)
        db.end_session("busy", "user_exit")
        db.begin_runtime_epoch("gw")
        db.admit_input("busy", "queued input")
    return {"ids": [*ids, "chain-root", "chain-tip", "old-open", "busy"], "doomed": doomed}


def remaining(db_path: Path, ids: list[str]) -> set[str]:
    with SessionDB(db_path, read_only=True) as db:
        return {sid for sid in ids if db.get_session(sid) is not None}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_dry_run_lists_exactly_what_the_prune_then_deletes(
    db_path: Path, seed: int
) -> None:
    store = aged_store(db_path, seed)
    before = db_path.read_bytes()

    listed = as_json(cli("--db", str(db_path), "sessions", "prune", "--dry-run", "--json"))
    assert listed["dry_run"] is True
    assert {r["id"] for r in listed["sessions"]} == store["doomed"]
    assert [r["started_at"] for r in listed["sessions"]] == sorted(
        r["started_at"] for r in listed["sessions"])  # oldest first
    assert set(listed["sessions"][0]) == {"id", "source", "title", "model", "started_at",
                                          "ended_at", "message_count", "archived"}
    text = cli("--db", str(db_path), "sessions", "prune", "--dry-run")
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["ID", "STARTED", "ENDED", "SOURCE", "MSGS", "TITLE"]
    assert {line.split()[0] for line in lines[1:-1]} == store["doomed"]
    assert f"would delete ended sessions idle for more than 90 days: {len(store['doomed'])} " \
           "session" in lines[-1]
    assert db_path.read_bytes() == before
    assert remaining(db_path, store["ids"]) == set(store["ids"])

    pruned = as_json(cli("--db", str(db_path), "sessions", "prune", "--yes", "--json"))
    assert pruned["pruned"] == len(store["doomed"]) and set(pruned["deleted"]) == \
        store["doomed"] and pruned["kept"] == []
    assert remaining(db_path, store["ids"]) == set(store["ids"]) - store["doomed"]


def test_without_yes_a_stdin_that_is_not_a_terminal_refuses_and_deletes_nothing(
    db_path: Path,
) -> None:
    store = aged_store(db_path, 4)
    for command in (["prune", "--older-than-days", "0"], ["delete", store["ids"][0]]):
        refused = cli("--db", str(db_path), "sessions", *command, stdin="y\n")
        assert refused.returncode == 2, refused.stderr
        assert "stdin is not a terminal" in refused.stderr and "--yes" in refused.stderr
        assert refused.stdout == ""
    assert remaining(db_path, store["ids"]) == set(store["ids"])


@pytest.mark.parametrize(("answer", "deleted"), [
    ("y", True), ("YES", True), ("n", False), ("", False), (None, False), ("sure", False),
])
def test_on_a_terminal_the_prune_lists_asks_and_only_a_yes_deletes(
    db_path: Path, answer: str | None, deleted: bool
) -> None:
    store = aged_store(db_path, 5)
    status, out, screen = on_terminal("--db", str(db_path), "sessions", "prune", answer=answer)
    question = screen[:screen.index("[y/N]")]
    assert "ID" in question and "TITLE" in question
    for sid in store["doomed"]:
        assert sid in question
    assert f"{len(store['doomed'])} sessions" in question
    left = remaining(db_path, store["ids"])
    if deleted:
        assert status == 0 and f"deleted {len(store['doomed'])} sessions" in out
        assert left == set(store["ids"]) - store["doomed"]
    else:
        assert status == 1 and "nothing deleted" in screen
        assert left == set(store["ids"])


@pytest.mark.parametrize("seed", [6, 7, 8])
def test_what_qualifies_after_the_list_is_not_deleted_and_what_changed_is_kept(
    db_path: Path, seed: int
) -> None:
    store = aged_store(db_path, seed)
    listed = sorted(store["doomed"])
    changed = random.Random(seed).choice(listed)

    def meanwhile() -> None:  # another process writes while the question waits
        with SessionDB(db_path) as db:
            db.append_message(changed, "user", "back again")  # no longer idle
            db.end_session("old-open", "user_exit")  # idle for 200 days: qualifies now

    status, out, _ = on_terminal("--db", str(db_path), "sessions", "prune", answer="y",
                                 meanwhile=meanwhile)
    assert status == 0, out
    assert f"deleted {len(listed) - 1} session" in out
    assert "kept 1 listed session that changed since the list was made" in out
    assert changed in out
    left = remaining(db_path, store["ids"])
    assert changed in left and "old-open" in left
    assert left.isdisjoint(set(listed) - {changed})
    again = as_json(cli("--db", str(db_path), "sessions", "prune", "--dry-run", "--json"))
    assert [r["id"] for r in again["sessions"]] == ["old-open"]  # listed next time


def test_delete_lists_the_session_asks_and_deletes_only_on_yes(db_path: Path) -> None:
    store = aged_store(db_path, 7)
    victim = store["ids"][3]
    with SessionDB(db_path, read_only=True) as db:
        title = db.get_session(victim)["title"]

    shown = as_json(cli("--db", str(db_path), "sessions", "delete", title, "--dry-run", "--json"))
    assert [r["id"] for r in shown["sessions"]] == [victim]
    status, _, screen = on_terminal("--db", str(db_path), "sessions", "delete", title,
                                    answer="n")
    assert status == 1 and victim in screen and title in screen
    assert remaining(db_path, store["ids"]) == set(store["ids"])

    status, out, _ = on_terminal("--db", str(db_path), "sessions", "delete", title, answer="y")
    assert status == 0 and f"deleted {victim}" in out
    assert remaining(db_path, store["ids"]) == set(store["ids"]) - {victim}
    other = store["ids"][4]
    assert as_json(cli("--db", str(db_path), "sessions", "delete", other, "--yes",
                       "--json")) == {"session_id": other, "deleted": True}


def test_the_prune_help_states_the_default_and_the_ways_to_answer() -> None:
    shown = cli("sessions", "prune", "--help")
    assert shown.returncode == 0
    text = " ".join(shown.stdout.split())
    assert "(default: 90)" in text and "--dry-run" in text and "--yes, -y" in text
