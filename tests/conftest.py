"""Shared fixtures: every test runs with HERMES_HOME pointing at its own temporary directory,
so nothing here can reach a real home even by accident.

Multi-process behaviour is tested with real processes: :func:`run_python` runs a snippet in a
fresh interpreter, :func:`hold_write_lock` keeps SQLite's write lock in another process.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from hermes_state import SessionDB
from state_helpers import Connections, release_process

REPO_ROOT = Path(__file__).resolve().parent.parent

# Input generation slows with the machine's load (the suite runs in parallel workers on few
# cores): a slow draw is no failure of the code under test. Tests that set their own
# ``suppress_health_check`` list ``too_slow`` there too.
settings.register_profile("suite", suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("suite")

# Tests press Ctrl-C (SIGINT) on the command line they start. A shell that runs the suite in the
# background ignores SIGINT, and every child would inherit that: a handler (reset to the default
# in a child) lets them be interrupted as at a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The run's temporary directories go in one made for the run and removed when it ends,
    the workers' inside it: pytest would keep its last three runs in the system's temporary
    folder (gigabytes, for this suite). ``--basetemp DIR`` keeps a run's in ``DIR``."""
    if config.option.basetemp is not None or hasattr(config, "workerinput"):
        return  # a directory the caller chose, or a worker inside the run's
    scratch = tempfile.mkdtemp(prefix="hermes-state-tests-")
    config.option.basetemp = scratch
    config.add_cleanup(lambda: shutil.rmtree(scratch, ignore_errors=True))


@pytest.fixture(autouse=True)
def hermes_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hermes-home"
    home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(home))
    return home


@pytest.fixture
def db_path(hermes_home: Path) -> Path:
    return hermes_home / "state.db"


@pytest.fixture
def connections() -> Connections:
    """The connections the ``db`` fixture's handle opens (its ``on_connect`` hook), for a test
    that traces the statements of the handle's own connection or sets a limit on it."""
    return Connections(trace=False)


@pytest.fixture
def db(db_path: Path, connections: Connections) -> Iterator[SessionDB]:
    handle = SessionDB(db_path, on_connect=connections)
    try:
        yield handle
    finally:
        handle.close()


OpenDb = Callable[..., SessionDB]


@pytest.fixture
def open_db() -> Iterator[OpenDb]:
    """``SessionDB(*args, **kwargs)``: every handle opened through it is closed after the test."""
    opened: list[SessionDB] = []

    def open_(*args: object, **kwargs: object) -> SessionDB:
        handle = SessionDB(*args, **kwargs)  # type: ignore[arg-type]
        opened.append(handle)
        return handle

    yield open_
    for handle in opened:
        handle.close()


def subprocess_env(
    overrides: Mapping[str, str | None] = {}, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """This process's environment with ``overrides`` applied (None removes a variable) and the
    repository importable."""
    env = dict(os.environ if base is None else base)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def _run_python(
    code: str, *args: str, env: Mapping[str, str | None] = {}, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter (argv[1:] = ``args``) and return what it did."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        env=subprocess_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO_ROOT,
    )


RunPython = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def run_python() -> RunPython:
    """``run_python(code, *args, env={...})``: run a snippet in a fresh interpreter."""
    return _run_python


def _spawn_python(
    code: str, *args: str, env: Mapping[str, str | None] = {}
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=subprocess_env(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO_ROOT,
    )


def rest_of_output(proc: subprocess.Popen[str], timeout: float = 60) -> tuple[str, str]:
    """Wait for ``proc`` and return the rest of its stdout and stderr. Read through the pipes'
    file objects: after a ``readline()``, ``communicate()`` reads the descriptors directly and
    silently drops the lines already buffered. Kills the child after ``timeout`` seconds."""
    assert proc.stdout is not None and proc.stderr is not None
    watchdog = threading.Timer(timeout, proc.kill)
    watchdog.start()
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read()))  # type: ignore[union-attr]
    reader.start()
    try:
        out = proc.stdout.read()
        reader.join()
        proc.wait()
    finally:
        watchdog.cancel()
    return out, err[0]


@pytest.fixture
def spawn_python() -> Callable[..., subprocess.Popen[str]]:
    """``spawn_python(code, *args, env={...})``: start a snippet in a fresh interpreter, with
    stdout and stderr piped; the caller waits for it."""
    return _spawn_python


# Takes SQLite's write lock on argv[1] with BEGIN IMMEDIATE, says "locked", and keeps it for
# argv[2] seconds, or until its stdin is closed when argv[2] is "stdin".
_HOLDER_SCRIPT = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
if sys.argv[2] == "stdin":
    sys.stdin.read()
else:
    time.sleep(float(sys.argv[2]))
conn.execute("ROLLBACK")
conn.close()
"""

HoldWriteLock = Callable[..., contextlib.AbstractContextManager[subprocess.Popen[str]]]


@contextlib.contextmanager
def _holding_write_lock(
    path: Path, seconds: float | None = None
) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER_SCRIPT, str(path), "stdin" if seconds is None else
         str(seconds)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=subprocess_env(),
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "locked"
        yield proc
    finally:
        release_process(proc)


@pytest.fixture
def hold_write_lock() -> HoldWriteLock:
    """``with hold_write_lock(path, seconds=None) as proc:`` — another process holds the write
    lock of ``path`` (for ``seconds``, or until the block ends)."""
    return _holding_write_lock

def _damage_messages_table(db_path: Path) -> None:
    """Overwrite the root page of a closed store's ``messages`` b-tree: real corruption of a
    canonical table (not of a search index), met by the next write that touches messages."""
    raw = sqlite3.connect(db_path)
    try:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = raw.execute("SELECT rootpage FROM sqlite_master WHERE name = 'messages'")
        root = page.fetchone()[0]
        size = raw.execute("PRAGMA page_size").fetchone()[0]
    finally:
        raw.close()
    with open(db_path, "r+b") as f:
        f.seek((root - 1) * size)
        f.write(b"\xff" * size)


@pytest.fixture
def damage_messages_table() -> Callable[[Path], None]:
    return _damage_messages_table


# --- damaged files ----------------------------------------------------------------------------


def file_state(db_path: Path) -> dict[str, str | None]:
    """SHA-256 of the database file and of its -wal (None where missing), read without any
    SQLite connection. Call it from a process that holds no connection on the file: closing
    a descriptor on a database file drops every POSIX lock the process has on it."""
    state: dict[str, str | None] = {}
    for name in (db_path.name, db_path.name + "-wal"):
        path = db_path.with_name(name)
        state[name] = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
    return state


# Commits argv[2] rows to state_meta of argv[1] with automatic checkpoints off, then dies
# without closing, so the WAL keeps committed frames that were never copied into the file.
_COMMITTED_WAL_SCRIPT = """
import os, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA wal_autocheckpoint = 0")
for i in range(int(sys.argv[2])):
    conn.execute("INSERT INTO state_meta (key, value) VALUES (?, ?)", (f"wal-{i}", "v" * 100))
os._exit(0)
"""


def leave_committed_wal(db_path: Path, rows: int = 20) -> None:
    """Leave ``db_path`` closed with a -wal of committed frames not yet checkpointed (they
    touch ``state_meta`` only, so the pages of ``messages`` are still read from the file)."""
    done = subprocess.run(
        [sys.executable, "-c", _COMMITTED_WAL_SCRIPT, str(db_path), str(rows)],
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert db_path.with_name(db_path.name + "-wal").stat().st_size > 32


def table_pages(db_path: Path, table: str, page_type: str) -> list[int]:
    """The pages of ``table``'s b-tree of one type ("leaf", "internal"), in key order, read
    through a read-only connection (it cannot checkpoint, and leaves the -wal alone)."""
    conn = sqlite3.connect(f"{db_path.as_uri()}?mode=ro", uri=True)
    try:
        return [row[0] for row in conn.execute(
            "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = ? ORDER BY path",
            (table, page_type))]
    finally:
        conn.close()


def overwrite(db_path: Path, offset: int, data: bytes) -> None:
    """Write ``data`` into the closed file at ``offset``."""
    with open(db_path, "r+b") as f:
        f.seek(offset)
        f.write(data)
