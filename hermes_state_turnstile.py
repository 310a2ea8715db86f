"""Fair turns at the write lock for the writers of one store, across processes.

SQLite's busy handler polls. A writer that commits back to back (an import, a busy gateway)
takes the lock again in the moment between its transactions, so a writer of another process,
asleep in its busy handler, can miss every gap until its patience runs out.

The turnstile is an ``flock`` on ``<db>.writers``, a file the first writer kept waiting
creates. Every write passes it (a shared lock, taken and dropped) before it begins. A writer
that was kept waiting holds it exclusively for its next attempt (writers kept waiting queue
for it): no new transaction starts meanwhile, so the current one's commit hands the lock to the
writer that waited. The turnstile only orders writers, it never fails one: a writer that cannot
pass or take it within :data:`PASS_WAIT_S` goes on as if there were none, and a file that
cannot be opened or locked turns it off.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["PASS_WAIT_S", "Turnstile", "turnstile_path"]

#: The longest a write waits at the turnstile (a writer holding it is waiting for SQLite's
#: lock for at most its busy timeout, then lets go).
PASS_WAIT_S = 2.0
_POLL_S = 0.002


def turnstile_path(db_path: Path) -> Path:
    """The turnstile's file: ``<db>.writers`` beside the database."""
    return db_path.with_name(db_path.name + ".writers")


class Turnstile:
    """A handle's side of the turnstile.

    Callers hold the handle's lock around :meth:`turn`: ``flock`` belongs to the open file,
    so two threads must not use one descriptor at once."""

    def __init__(self, db_path: Path) -> None:
        self._path = turnstile_path(db_path)
        self._fd: int | None = None
        self._off = False
        self._guard = threading.Lock()

    def _descriptor(self, create: bool) -> int | None:
        """The turnstile's descriptor; None while there is no file (no writer has been kept
        waiting: the first that is creates it) or when it cannot be opened (turned off)."""
        with self._guard:
            if self._fd is None and not self._off:
                flags = os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC
                try:
                    self._fd = os.open(self._path, flags | (os.O_CREAT if create else 0), 0o600)
                except FileNotFoundError:
                    if create:
                        self._off = True
                except OSError:
                    self._off = True
            return self._fd

    @contextlib.contextmanager
    def turn(self, waited: bool) -> Iterator[None]:
        """Around one write attempt: pass the turnstile, or, once ``waited``, hold it."""
        fd = self._descriptor(create=waited)
        held = False
        if fd is not None:
            try:
                held = _wait_for(fd, fcntl.LOCK_EX if waited else fcntl.LOCK_SH)
                if held and not waited:
                    fcntl.flock(fd, fcntl.LOCK_UN)  # passed
                    held = False
            except OSError:  # a file system without flock: no turnstile
                self._off = True
                self.close()
        try:
            yield
        finally:
            if held and fd is not None:
                with contextlib.suppress(OSError):
                    fcntl.flock(fd, fcntl.LOCK_UN)

    def close(self) -> None:
        with self._guard:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


def _try(fd: int, kind: int) -> bool:
    """Take ``kind`` without waiting: False while another holds a conflicting lock."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait_for(fd: int, kind: int) -> bool:
    """Take ``kind``, waiting at most :data:`PASS_WAIT_S` while a writer that waited holds
    the turnstile; False when the wait ran out."""
    deadline = time.monotonic() + PASS_WAIT_S
    while not _try(fd, kind):
        if time.monotonic() > deadline:
            return False
        time.sleep(_POLL_S)
    return True
