"""The write path: what one write method's call does, top to bottom, and how long a write waits
for the lock, how it backs off, and what an error does to it.

A call of a write method, in order (:func:`call`; the facade's table names each method's
:class:`WritePolicy` beside it, and ``hermes_state_methods`` binds the entry to this path):
refuse a closed, read-only or quarantined handle (:func:`check_writable`); check the
arguments; run the function as one write (:func:`write`); on a corrupt file, spool the
messages the call carries (the policy's :class:`~hermes_state_quarantine.Spool`); once
committed, the function's own after-commit work (:class:`Work`).

One write (:func:`write`): under the handle's lock and the writers' turnstile, one
``BEGIN IMMEDIATE`` transaction, so contention surfaces at its start; after the commit, the
checkpoint policy (:class:`Checkpoints`). :func:`retrying` wraps the whole attempt. A lock
error retries the whole transaction after a random pause, so writers do not retry in
lockstep. The patience depends on the :data:`WriteKind`: 20 s for a write, 60 s for a
transcript, 0.5 s for an activity stamp, which is then skipped.

:func:`classify` judges every other error. Proven FTS damage detaches the indexes and retries
once; other damage quarantines the file. ``MemoryError`` counts as index damage only when the
index is to blame. Every 50th commit is followed by a PASSIVE checkpoint.

The figures are the seed's named constants, gathered in a frozen :class:`Timing`; a handle
takes another with ``SessionDB(path, timing=Timing(...))``."""

from __future__ import annotations

import enum
import inspect
import logging
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Literal, NoReturn, Protocol, TypeVar

import hermes_state_fulltext as fulltext
import hermes_state_replication as replication
import hermes_state_schema as schema
from hermes_state_connect import transaction
from hermes_state_home import append_error_log
from hermes_state_errors import HermesStateError, InvalidInputError, InvalidTypeError
from hermes_state_errors import ReplicationError, StateDbClosedError, StateDbCorruptError
from hermes_state_errors import StateDbLockedError
from hermes_state_errors import is_corruption_error, is_sqlite_lock_error, translate
from hermes_state_fts import damage_is_fts_only, detach_index, optimize_indexes
from hermes_state_impact import drop_index, missing_index_object
from hermes_state_quarantine import Spool, Watch
from hermes_state_turnstile import Turnstile
from hermes_state_lockowners import describe_lock_holders

__all__ = [
    "WriteKind",
    "WritePolicy",
    "Work",
    "Function",
    "Args",
    "Kwargs",
    "call",
    "Timing",
    "timing_of",
    "RetryPolicy",
    "delay",
    "locked_error",
    "Verdict",
    "classify",
    "CHECKPOINT_SQL",
    "passive_checkpoint",
    "truncate_checkpoint",
    "TRUNCATE_CHECKPOINT_SQL",
    "Store",
    "retrying",
    "write",
    "outside_transaction",
    "check_open",
    "check_writable",
    "fts_only",
    "checkpoint",
    "vacuum",
    "VACUUM_SQL",
    "Checkpoints",
    "WAL_AUTOCHECKPOINT_OFF_SQL",
    "WAL_AUTOCHECKPOINT_DEFAULT_SQL",
]

logger = logging.getLogger("hermes_state")

#: What a write carries, which sets its patience (see the module docstring).
WriteKind = Literal["write", "transcript", "activity"]


@dataclass(frozen=True)
class RetryPolicy:
    """How one write waits for SQLite's write lock."""

    patience_s: float  # give up once this long has passed since the first attempt
    fast_window_s: float  # pauses are short while less than this has passed
    fast_pause_s: tuple[float, float]  # the range of a pause inside the fast window
    slow_pause_s: tuple[float, float]  # the range of a pause after it


# The seed's figures (see the module docstring).
_WRITE_PATIENCE_S, _TRANSCRIPT_WRITE_PATIENCE_S, _ACTIVITY_WRITE_PATIENCE_S = 20.0, 60.0, 0.5
_WRITE_RETRY_MIN_S, _WRITE_RETRY_MAX_S = 0.020, 0.150
_WRITE_RETRY_SLOW_MIN_S, _WRITE_RETRY_SLOW_MAX_S = 0.250, 1.000
_CHECKPOINT_EVERY_N_WRITES = 50
_FAST_RETRY_WINDOW_S = 2.0
_SQLITE_BUSY_TIMEOUT_S = 1.0
_READ_BUSY_TIMEOUT_S = 5.0
# Between two publish transactions of an import the lock stays free this long: a writer
# waiting in SQLite's busy handler polls at least every 100 ms, so it gets its turn instead of
# starving behind the import's next BEGIN IMMEDIATE.
_IMPORT_PAUSE_S = 0.12


@dataclass(frozen=True)
class Timing:
    """How long a handle waits and how often it checkpoints: the patience of each
    :data:`WriteKind`, the ranges of the pauses between attempts (``fast_pause_s`` during the
    first ``fast_window_s``, ``slow_pause_s`` after), a PASSIVE checkpoint after every
    ``checkpoint_every``-th commit, SQLite's busy timeout of a writable connection
    (``busy_timeout_s``), the one wait of a read-only open (``read_busy_timeout_s``) and the
    pause between two publish transactions of a long import (``import_pause_s``).
    Every figure is checked when the object is made (:class:`InvalidInputError`)."""

    write_patience_s: float = _WRITE_PATIENCE_S
    transcript_patience_s: float = _TRANSCRIPT_WRITE_PATIENCE_S
    activity_patience_s: float = _ACTIVITY_WRITE_PATIENCE_S
    fast_pause_s: tuple[float, float] = (_WRITE_RETRY_MIN_S, _WRITE_RETRY_MAX_S)
    slow_pause_s: tuple[float, float] = (_WRITE_RETRY_SLOW_MIN_S, _WRITE_RETRY_SLOW_MAX_S)
    fast_window_s: float = _FAST_RETRY_WINDOW_S
    checkpoint_every: int = _CHECKPOINT_EVERY_N_WRITES
    busy_timeout_s: float = _SQLITE_BUSY_TIMEOUT_S
    read_busy_timeout_s: float = _READ_BUSY_TIMEOUT_S
    import_pause_s: float = _IMPORT_PAUSE_S

    def __post_init__(self) -> None:
        for name in ("write_patience_s", "transcript_patience_s", "activity_patience_s",
                     "fast_window_s", "busy_timeout_s", "read_busy_timeout_s",
                     "import_pause_s"):
            _check_seconds(name, getattr(self, name))
        for name in ("fast_pause_s", "slow_pause_s"):
            pause = getattr(self, name)
            if not (isinstance(pause, tuple) and len(pause) == 2):
                raise InvalidInputError(f"{name} must be a (low, high) pair of seconds",
                                        argument=name)
            _check_seconds(name, pause[0])
            _check_seconds(name, pause[1])
            if pause[0] > pause[1]:
                raise InvalidInputError(f"{name}: {pause[0]} > {pause[1]}", argument=name)
        every = self.checkpoint_every
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise InvalidInputError(
                f"checkpoint_every must be a positive integer, not {every!r}",
                argument="checkpoint_every")

    def policy(self, kind: WriteKind) -> RetryPolicy:
        """The retry policy of a ``kind`` of write."""
        patience = {"write": self.write_patience_s, "transcript": self.transcript_patience_s,
                    "activity": self.activity_patience_s}[kind]
        return RetryPolicy(patience, self.fast_window_s, self.fast_pause_s, self.slow_pause_s)


def timing_of(timing: object) -> Timing:
    """The figures a handle is given: ``timing`` itself, the defaults for None, else
    :class:`InvalidTypeError`."""
    if timing is None:
        return Timing()
    if not isinstance(timing, Timing):
        raise InvalidTypeError(f"timing must be a Timing, not {type(timing).__name__}",
                               argument="timing")
    return timing


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidTypeError(f"{name} must be a number of seconds, not {value!r}",
                               argument=name)
    if not 0 <= value < float("inf"):
        raise InvalidInputError(f"{name} must be a finite number of seconds >= 0, not {value!r}",
                                argument=name)


def delay(elapsed: float, policy: RetryPolicy, rng: random.Random) -> float | None:
    """The pause before the next attempt of a write that has waited ``elapsed`` seconds:
    uniform in the window's range, never past the patience (at least 1 ms); None once the
    patience has run out."""
    remaining = policy.patience_s - elapsed
    if remaining <= 0:
        return None
    low, high = policy.fast_pause_s if elapsed < policy.fast_window_s else policy.slow_pause_s
    return max(min(rng.uniform(low, high), remaining), 0.001)


def locked_error(db_path: Path, home: Path, waited: float, attempts: int) -> StateDbLockedError:
    """The error of a write whose patience ran out, naming the processes holding the lock; the
    same line goes to a WARNING and to ``<home>/logs/errors.log``."""
    holders = describe_lock_holders(db_path)
    line = "; ".join(holders) if holders else "no lock holder could be named"
    logger.warning("write to %s gave up after %.1f s: %s", db_path, waited, line)
    append_error_log(f"database is locked: {db_path}: {line}", home)
    return StateDbLockedError(
        f"{db_path} stayed locked for {waited:.1f} s ({attempts} attempts): {line}",
        path=db_path,
        waited_s=waited,
        attempts=attempts,
        holders=holders,
    )


class Verdict(enum.Enum):
    """What an error met by a write attempt does to the write."""

    RETRY = "retry"  # the file is locked: wait and try again (patience permitting)
    DETACH_INDEX = "detach the index"  # the FTS indexes only are damaged: again without them
    QUARANTINE = "quarantine"  # the file is damaged: never write to it again
    RAISE = "raise"  # anything else: the caller sees it


def classify(
    exc: BaseException,
    *,
    index_detached: bool,
    fts_only: Callable[[BaseException], bool],
) -> Verdict:
    """The verdict on ``exc``, met by a write attempt. ``index_detached``: the attempt already
    ran without the indexes (a second proof of FTS-only damage is not believed);
    ``fts_only(exc)`` proves the damage lies in the indexes only (it reads the file, so it is
    asked only about corruption and memory errors)."""
    if isinstance(exc, sqlite3.Error) and is_sqlite_lock_error(exc):
        return Verdict.RETRY
    corrupt = isinstance(exc, sqlite3.Error) and is_corruption_error(exc)
    if not (corrupt or isinstance(exc, MemoryError)):
        return Verdict.RAISE
    if not index_detached and fts_only(exc):
        return Verdict.DETACH_INDEX
    return Verdict.QUARANTINE if corrupt else Verdict.RAISE


# The checkpoint that never waits for readers or writers; its result row is inspected.
CHECKPOINT_SQL = "PRAGMA wal_checkpoint(PASSIVE)"


# The checkpoint that waits for the writer lock and readers, then empties the WAL file.
TRUNCATE_CHECKPOINT_SQL = "PRAGMA wal_checkpoint(TRUNCATE)"


def truncate_checkpoint(conn: sqlite3.Connection, /) -> tuple[int, int, int]:
    """One TRUNCATE checkpoint (outside any transaction); SQLite's result row. Only outside
    the WAL-reset bug range: one that cannot take the writer lock carries on as a PASSIVE one
    without it, the very race the bug needs (see :func:`passive_checkpoint`)."""
    row = conn.execute(TRUNCATE_CHECKPOINT_SQL).fetchone()
    return int(row[0]), int(row[1]), int(row[2])


def passive_checkpoint(
    conn: sqlite3.Connection, /, helper: sqlite3.Connection | None
) -> tuple[int, int, int]:
    """One PASSIVE checkpoint, not retried; SQLite's result row (busy, frames in the WAL,
    frames checkpointed).

    With an SQLite inside the WAL-reset bug range the handle passes a ``helper`` connection:
    the checkpoint then runs from it while ``conn`` holds the write lock, so that no writer of
    any process can reset the WAL under it (a connection cannot checkpoint inside its own
    transaction). The checkpoint SQLite runs when the last connection to the file closes is
    safe as it is: SQLite runs it only after taking the database's EXCLUSIVE lock, which no
    other connection holds while one exists."""
    if helper is None:
        row = conn.execute(CHECKPOINT_SQL).fetchone()
    else:
        with transaction(conn):
            row = helper.execute(CHECKPOINT_SQL).fetchone()
    busy, log_frames, checkpointed = int(row[0]), int(row[1]), int(row[2])
    if busy or checkpointed < log_frames:
        logger.debug("checkpoint: %d of %d WAL frames copied (busy=%d)",
                     checkpointed, log_frames, busy)
    return busy, log_frames, checkpointed


# --- one call of a write method ------------------------------------------------------------

T = TypeVar("T")
U = TypeVar("U")

class Store(Protocol):
    """What the write path needs of a handle (``SessionDB``)."""

    path: Path
    profile_home: Path
    read_only: bool
    write_retries: int
    timing: Timing
    _closed: bool
    _connection: sqlite3.Connection
    _checkpoints: Checkpoints
    _watch: Watch
    _turnstile: Turnstile

    @property
    def _lock(self) -> AbstractContextManager[Any]: ...

    def _write(self, fn: Callable[[sqlite3.Connection], T], kind: WriteKind = ..., *,
               may_drop_index: bool = ...) -> T: ...


@dataclass(frozen=True)
class WritePolicy:
    """A write method's policy, declared beside it in the facade's table: the :data:`WriteKind`
    that sets its patience (an ``"activity"`` stamp whose patience ran out is skipped, logged,
    and answers None), and for a write that carries a transcript the :class:`Spool` that keeps
    its messages when the file turns out corrupt."""

    kind: WriteKind = "write"
    spool: Spool | None = None


@dataclass(frozen=True)
class Work(Generic[U, T]):
    """One call's work, its arguments bound: ``run(conn)`` inside the write transaction (again
    when the transaction is retried), then ``finish(done)`` once it committed, which gives the
    method's result."""

    run: Callable[[sqlite3.Connection], U]
    finish: Callable[[U], T]


#: A call's positional and keyword arguments, as a method receives them.
Args = tuple[Any, ...]
Kwargs = dict[str, Any]


@dataclass(frozen=True)
class Function(Generic[T]):
    """A write method's sibling function as :func:`call` runs it (``hermes_state_methods``
    binds it): its ``name``, its ``signature`` (the connection first: a spool binds the call
    to it), the ``check`` of its arguments, and ``work(store, args, kwargs)``, one call's
    :class:`Work`."""

    name: str
    signature: inspect.Signature
    check: Callable[[Args, Kwargs], tuple[Args, Kwargs]]
    work: Callable[[Any, Args, Kwargs], Work[Any, T]]


def call(store: Store, policy: WritePolicy, function: Function[T], args: Args,
         kwargs: Kwargs) -> T | None:
    """One call of a write method, in order: a handle that takes no writes refuses it (before
    its arguments are looked at); the arguments are checked; the function runs as one
    :func:`write` of the policy's kind; a write refused because the file is corrupt spools the
    messages it carries, whatever their values, and the raised :class:`StateDbCorruptError`
    names the file in ``spooled_to``; once committed, the function's after-commit work gives
    the result. An activity stamp that stayed locked answers None instead."""
    args, kwargs = _replayable(args, kwargs)
    try:
        check_writable(store)
        args, kwargs = function.check(args, kwargs)
        work = function.work(store, args, kwargs)
        done = write(store, work.run, policy.kind)
    except StateDbCorruptError as exc:
        if policy.spool is not None:
            policy.spool.keep(exc, function.signature, args, kwargs, store.profile_home)
        raise
    except StateDbLockedError as exc:
        if policy.kind != "activity":
            raise
        # The write path has already logged the lock holders; the observation is dropped.
        logger.warning("%s on %s skipped: the store stayed locked: %s",
                       function.name, store.path, exc)
        return None
    return work.finish(done)


def _replayable(args: Args, kwargs: Kwargs) -> tuple[Args, Kwargs]:
    """The arguments with every one-shot iterator made a list: a retried transaction calls
    the function again."""
    return (tuple(list(a) if isinstance(a, Iterator) else a for a in args),
            {k: list(v) if isinstance(v, Iterator) else v for k, v in kwargs.items()})


def check_open(store: Store) -> None:
    """:class:`StateDbClosedError` once the handle is closed."""
    if store._closed:
        raise StateDbClosedError(f"SessionDB for {store.path} is closed")


def check_writable(store: Store) -> None:
    """Refuse a write on a closed or read-only handle, and on a quarantined one (after taking
    on a quarantine another handle of this process met). A method asks before its arguments
    are checked; each attempt asks again under the handle's lock."""
    check_open(store)
    if store.read_only:
        raise HermesStateError(f"SessionDB for {store.path} is read-only")
    store._watch.adopt()
    store._watch.refuse_writes()


def write(
    store: Store,
    fn: Callable[[sqlite3.Connection], T],
    kind: WriteKind = "write",
    *,
    may_drop_index: bool = True,
) -> T:
    """Run ``fn(conn)`` as one write: each attempt, under the handle's lock, passes the
    writers' turnstile (hermes_state_turnstile; an attempt that was kept waiting holds it),
    asks :func:`check_writable` again and runs ``fn`` in one ``BEGIN IMMEDIATE`` transaction;
    after the commit, the checkpoint policy. :func:`retrying` repeats the attempt under the
    patience of ``kind`` and judges its errors (damage quarantines the file)."""

    def attempt(detach: bool, waited: bool) -> T:
        with store._lock, store._turnstile.turn(waited):
            check_writable(store)
            with transaction(store._connection):
                if detach:
                    detach_index(store._connection)
                result = fn(store._connection)
            store._checkpoints.after_commit(store._connection)
        return result

    return retrying(store, attempt, kind, drop_search_index=(
        (lambda: write(store, drop_index, may_drop_index=False)) if may_drop_index else None))


def outside_transaction(store: Store, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn(conn)`` for statements SQLite refuses inside a transaction (pragmas,
    ``VACUUM``, integrity checks, checkpoints): under the handle's lock, retried while the
    file is locked as a write is, with no ``BEGIN`` and no checkpoint after it."""

    def attempt(detach: bool, waited: bool) -> T:
        with store._lock, store._turnstile.turn(waited):
            check_writable(store)
            if detach:
                with transaction(store._connection):
                    detach_index(store._connection)
            return fn(store._connection)

    return retrying(store, attempt, "write",
                    drop_search_index=lambda: write(store, drop_index, may_drop_index=False))


# --- the retry loop of one write -----------------------------------------------------------

# The pauses between attempts are random so that contending writers do not retry in lockstep.
_JITTER = random.Random()


def retrying(
    store: Store,
    attempt: Callable[[bool, bool], T],
    kind: WriteKind,
    *,
    drop_search_index: Callable[[], None] | None,
) -> T:
    """``attempt(detach_index, waited)`` until it succeeds or the verdict on its error ends
    it; ``waited``: an earlier attempt met the lock taken (see hermes_state_turnstile). Before
    any verdict, an error one of the :class:`_Repairs` mends is mended once and the attempt
    made again."""
    policy = store.timing.policy(kind)
    start, attempts, detach_index, kept_waiting = time.monotonic(), 1, False, False
    repairs = _Repairs(store, drop_search_index)
    while True:
        try:
            return attempt(detach_index, kept_waiting)
        except (sqlite3.Error, MemoryError) as exc:
            if repairs.mended(exc):
                continue
            verdict = classify(exc, index_detached=detach_index,
                               fts_only=lambda exc: fts_only(store, exc))
            if verdict is Verdict.RETRY:
                _pause(store, policy, time.monotonic() - start, attempts, exc)
                kept_waiting = True
            elif verdict is Verdict.DETACH_INDEX:
                logger.warning("FTS index damaged (%s); detaching it from %s", exc, store.path)
                detach_index = True
            else:
                _give_up(store, verdict, exc)
            attempts += 1


class _Repairs:
    """What a write mends once, in a write of its own, before it tries again.

    ``drop_search_index`` (None: not this time) drops the search index when the error says
    one of its tables is gone: its triggers then fail every write of messages, so the rest of
    it is dropped too and the write goes through; the next writable open creates it anew
    (searches rank with FTS5 meanwhile). The handle's drop is itself a write that may not drop
    again, so a drop that meets the same error ends, typed, instead of recursing.

    An error saying this SQLite lacks FTS5 (the triggers of an index another process with FTS5
    put back meanwhile) detaches the indexes, and the write goes through without them (see
    hermes_state_fulltext)."""

    def __init__(self, store: Store, drop_search_index: Callable[[], None] | None) -> None:
        self.store = store
        self.drop_search_index = drop_search_index
        self.detach_unavailable = True

    def mended(self, exc: BaseException) -> bool:
        """Whether ``exc`` was mended (the attempt is to be made again)."""
        if self.detach_unavailable and fulltext.is_unavailable_error(exc):
            logger.warning("%s; detaching the full-text indexes of %s", exc, self.store.path)
            write(self.store, schema.detach_unavailable, may_drop_index=False)
            self.detach_unavailable = False
            return True
        if self.drop_search_index is not None and missing_index_object(exc):
            logger.warning("search index incomplete (%s); dropping it from %s until "
                           "the next open", exc, self.store.path)
            self.drop_search_index()
            self.drop_search_index = None
            return True
        return False


def _pause(store: Store, policy: RetryPolicy, waited: float, attempts: int,
           exc: BaseException) -> None:
    """Sleep before the next attempt of a write kept waiting ``waited`` seconds;
    :class:`StateDbLockedError` once its patience ran out."""
    pause = delay(waited, policy, _JITTER)
    if pause is None:
        raise locked_error(store.path, store.profile_home, waited, attempts) from exc
    store.write_retries += 1
    logger.debug("write to %s busy (attempt %d); retrying in %.3f s",
                 store.path, attempts, pause)
    time.sleep(pause)


def _give_up(store: Store, verdict: Verdict, exc: BaseException) -> NoReturn:
    """End the write with ``exc``, typed; a file found damaged is quarantined first."""
    if verdict is Verdict.QUARANTINE:
        store._watch.enter(exc)
    if isinstance(exc, sqlite3.Error):
        raise translate(exc, store.path) from exc
    raise exc


def fts_only(store: Store, exc: BaseException) -> bool:
    """Whether the damage ``exc`` shows is proven to lie in the FTS indexes only."""
    with store._lock:
        return damage_is_fts_only(store._connection, exc)


def checkpoint(store: Store) -> tuple[int, int, int]:
    """Run a PASSIVE WAL checkpoint now (retried while another process holds the lock it
    needs). Returns SQLite's result row: (busy, frames in the WAL, frames checkpointed).
    :class:`ReplicationError` while checkpoints are left to Litestream."""
    with store._lock:
        if not store.read_only:
            store._checkpoints.refuse_if_left(store._connection)
    outside_transaction(store, store._checkpoints.run)
    assert store._checkpoints.last is not None
    return store._checkpoints.last


# SQLite refuses VACUUM inside a transaction.
VACUUM_SQL = "VACUUM"


def vacuum(store: Store) -> int:
    """Merge each FTS index's segments (``optimize``), checkpoint, then ``VACUUM``; returns
    how many indexes were merged. The checkpoint follows the handle's rules: none while
    checkpoints are left to Litestream, the handle's PASSIVE one (from its helper, under the
    write lock) inside the WAL-reset bug range, else TRUNCATE."""
    merged = write(store, optimize_indexes)
    outside_transaction(store, store._checkpoints.truncate)
    outside_transaction(store, lambda conn: conn.execute(VACUUM_SQL).close())
    return merged


# --- the checkpoint policy ----------------------------------------------------------------------

# Switches off automatic checkpoints for one connection (no file is read or written).
WAL_AUTOCHECKPOINT_OFF_SQL = "PRAGMA wal_autocheckpoint = 0"
# Gives one connection back SQLite's default automatic checkpoint (at 1000 WAL pages).
WAL_AUTOCHECKPOINT_DEFAULT_SQL = "PRAGMA wal_autocheckpoint = 1000"


class Checkpoints:
    """The checkpoint policy of one writable handle: a PASSIVE checkpoint after every
    ``every``-th commit, none while the file's checkpoints are left to Litestream, and, inside
    the WAL-reset bug range, every checkpoint from a helper connection (see
    :func:`passive_checkpoint`). The handle calls it under its lock."""

    def __init__(
        self,
        path: Path,
        connect_helper: Callable[[], sqlite3.Connection],
        *,
        leave_to_litestream: bool,
        wal_reset_exposed: bool,
        every: int,
    ) -> None:
        self.path = path
        self._connect_helper = connect_helper
        self.left_to_litestream = leave_to_litestream
        self.wal_reset_exposed = wal_reset_exposed
        self.every = every
        self.helper: sqlite3.Connection | None = None
        self.last: tuple[int, int, int] | None = None
        self._writes = 0

    def automatic_off(self) -> bool:
        """Whether the connections' automatic checkpoints must stay off."""
        return self.wal_reset_exposed or self.left_to_litestream

    def owned(self, conn: sqlite3.Connection) -> bool:
        """False while this file's checkpoints are left to Litestream. Asked at every
        checkpoint decision; when the answer changes, the automatic checkpoints of ``conn``
        and the helper follow it. A setting that turned invalid after the open keeps the last
        answer: this runs after a committed write, which must not look failed."""
        try:
            leave = replication.checkpoints_left_to_litestream(self.path)
        except ReplicationError as exc:
            logger.warning("%s; keeping the previous checkpoint setting", exc)
            return not self.left_to_litestream
        if leave != self.left_to_litestream:
            self.left_to_litestream = leave
            sql = WAL_AUTOCHECKPOINT_OFF_SQL if self.automatic_off() else (
                WAL_AUTOCHECKPOINT_DEFAULT_SQL)
            for each in filter(None, (conn, self.helper)):
                each.execute(sql)
        return not leave

    def refuse_if_left(self, conn: sqlite3.Connection) -> None:
        """:class:`ReplicationError` while the checkpoints are left to Litestream."""
        if not self.owned(conn):
            raise ReplicationError(
                f"the checkpoints of {self.path} are left to Litestream",
                reason="checkpoints_left_to_litestream",
                path=self.path,
            )

    def run(self, conn: sqlite3.Connection) -> None:
        """One PASSIVE checkpoint: every checkpoint of the handle runs here, from the helper
        connection inside the WAL-reset bug range."""
        if self.wal_reset_exposed and self.helper is None:
            self.helper = self._connect_helper()
        helper = self.helper if self.wal_reset_exposed else None
        self.last = passive_checkpoint(conn, helper)

    def truncate(self, conn: sqlite3.Connection) -> None:
        """A checkpoint that empties the WAL where that is safe (a PASSIVE one inside the
        WAL-reset bug range); nothing while the checkpoints are left to Litestream."""
        if not self.owned(conn):
            return
        if self.wal_reset_exposed:
            self.run(conn)
        else:
            self.last = truncate_checkpoint(conn)

    def after_commit(self, conn: sqlite3.Connection) -> None:
        """Count a commit; every ``every``-th is followed by a checkpoint, skipped (logged)
        when it fails: the commit it follows stands."""
        self._writes += 1
        if self._writes % self.every == 0 and self.owned(conn):
            try:
                self.run(conn)
            except sqlite3.Error as exc:
                logger.debug("checkpoint of %s skipped: %s", self.path, exc)

    def close(self) -> None:
        if self.helper is not None:
            self.helper.close()
