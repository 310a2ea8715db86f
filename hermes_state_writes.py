"""The write policy: how long a write waits for the lock, how it backs off, and what an error
it meets does to it.

Every write is one ``BEGIN IMMEDIATE`` transaction (``hermes_state_connect.transaction``), so
lock contention surfaces when the transaction starts, never half-way through it. SQLite's own
busy timeout is short (1 s); on a lock error (recognised by result code) the whole transaction
is retried after a random pause — 20–150 ms during the first 2 s, then 250 ms–1 s, so that
contending writers do not retry in lockstep — until the write's *patience* runs out. The
patience depends on what is written (:data:`WriteKind`):

* ``"write"``, 20 s: an ordinary write (a session, a title, a ledger row);
* ``"transcript"``, 60 s: a message the user or the model produced, which would be lost;
* ``"activity"``, 0.5 s: an observation-only stamp (the working directory a session was last
  seen in). Nothing depends on it and the next observation stamps again, so it is skipped,
  logged, when its patience runs out, rather than keeping the code that observed it waiting.

Then :class:`~hermes_state_errors.StateDbLockedError` names the processes holding the lock.
:func:`classify` sorts every other error a write meets (:class:`Verdict`): corruption proven to
lie in the FTS indexes only detaches them (``fts_stale``) and the canonical write is retried
once without them; any other corruption quarantines the file (``hermes_state_quarantine``);
everything else is raised. ``MemoryError`` is one of those "everything else" unless the index
is to blame: FTS5 reading a damaged index can ask for absurd amounts of memory.

After a commit the handle counts the write; every 50th is followed by a PASSIVE checkpoint.
Statements SQLite refuses inside a transaction (pragmas, ``VACUUM``, integrity checks,
checkpoints) take the same retries under the handle's lock, with no ``BEGIN`` and no
checkpoint after them.

The figures are the ``hermes_state`` module's constants, read each time a policy is built (the
seed names them, and tests shorten them at run time).
"""

from __future__ import annotations

import enum
import logging
import random
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, TypeVar

import hermes_state_fulltext as fulltext
import hermes_state_replication as replication
import hermes_state_schema as schema
from hermes_state_connect import transaction
from hermes_state_home import append_error_log
from hermes_state_errors import ReplicationError, StateDbLockedError
from hermes_state_errors import is_corruption_error, is_sqlite_lock_error, translate
from hermes_state_impact import missing_index_object
from hermes_state_lockowners import describe_lock_holders

__all__ = [
    "WriteKind",
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


# --- the retry loop ---------------------------------------------------------------------------

T = TypeVar("T")

# The pauses between attempts are random so that contending writers do not retry in lockstep.
_JITTER = random.Random()


class Store(Protocol):
    """What the retry loop needs of a handle."""

    path: Path
    profile_home: Path
    write_retries: int

    def _policy(self, kind: WriteKind) -> RetryPolicy: ...

    def _fts_only(self, exc: BaseException) -> bool: ...

    def _quarantine(self, exc: BaseException) -> None: ...

    def _write(self, fn: Callable[[sqlite3.Connection], T], kind: WriteKind = ..., *,
               may_drop_index: bool = ...) -> T: ...


def retrying(
    store: Store,
    attempt: Callable[[bool], T],
    kind: WriteKind,
    *,
    drop_search_index: Callable[[], None] | None,
) -> T:
    """``attempt(detach_index)`` until it succeeds or the verdict on its error ends it.

    ``drop_search_index`` (None: not this time) drops the search index once, when the error
    says one of its tables is gone: its triggers then fail every write of messages, so the
    rest of it is dropped too and the write goes through; the next writable open creates it
    anew (searches rank with FTS5 meanwhile). The handle's drop is itself a write that may
    not drop again, so a drop that meets the same error ends, typed, instead of recursing.

    An error saying this SQLite lacks FTS5 (the triggers of an index another process with FTS5
    put back meanwhile) detaches the indexes in a write of their own, once, and the write goes
    through without them (see hermes_state_fulltext)."""
    policy = store._policy(kind)
    start, attempts, detach_index = time.monotonic(), 1, False
    detach_unavailable = True
    while True:
        try:
            return attempt(detach_index)
        except (sqlite3.Error, MemoryError) as exc:
            if detach_unavailable and fulltext.is_unavailable_error(exc):
                logger.warning("%s; detaching the full-text indexes of %s", exc, store.path)
                store._write(schema.detach_unavailable, may_drop_index=False)
                detach_unavailable = False
                continue
            if drop_search_index is not None and missing_index_object(exc):
                logger.warning("search index incomplete (%s); dropping it from %s until "
                               "the next open", exc, store.path)
                drop_search_index()
                drop_search_index = None
                continue
            verdict = classify(exc, index_detached=detach_index, fts_only=store._fts_only)
            if verdict is Verdict.RETRY:
                waited = time.monotonic() - start
                pause = delay(waited, policy, _JITTER)
                if pause is None:
                    raise locked_error(store.path, store.profile_home, waited, attempts) from exc
                store.write_retries += 1
                logger.debug("write to %s busy (attempt %d); retrying in %.3f s",
                             store.path, attempts, pause)
                time.sleep(pause)
            elif verdict is Verdict.DETACH_INDEX:
                logger.warning("FTS index damaged (%s); detaching it from %s", exc, store.path)
                detach_index = True
            else:
                if verdict is Verdict.QUARANTINE:
                    store._quarantine(exc)
                if isinstance(exc, sqlite3.Error):
                    raise translate(exc, store.path) from exc
                raise
            attempts += 1


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
