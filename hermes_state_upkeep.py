"""The upkeep of a store's derived indexes: the three FTS indexes and the search index.

A writable handle starts one background thread when an index needs work. Each job runs under
the cross-process admission lock and stops when the handle closes. A damaged record found
before a rebuild quarantines the file instead."""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, TypeVar

import hermes_state_fts as fts
import hermes_state_fulltext as fulltext
import hermes_state_impact as impact
from hermes_state_errors import HermesStateError, StateDbCorruptError
from hermes_state_quarantine import Watch

__all__ = ["Handle", "Store", "Upkeep", "check_fts_integrity", "rebuild_fts",
           "started_index_upkeep", "wait_for_index"]

logger = logging.getLogger("hermes_state")

T = TypeVar("T")


class Store(Protocol):
    """What the upkeep needs of a handle: its file, its reads and writes, its quarantine."""

    path: Path
    _watch: Watch

    def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...


class Upkeep:
    """The index jobs of one handle, and the background thread that runs them."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self.thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        """Start the background thread when an index needs work (see the module's text)."""
        if self._store._read(lambda conn: _whole(fts.index_state(conn))
                             and not fts.respell_due(conn)
                             and not impact.needs_maintenance(conn)):
            return
        self.thread = threading.Thread(
            target=self._in_background, name="hermes-state-fts-rebuild", daemon=True
        )
        self.thread.start()

    def wait(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds for the background thread; True once it is over."""
        if self.thread is not None:
            self.thread.join(timeout)
            return not self.thread.is_alive()
        return True

    def stop(self) -> None:
        """Ask the background jobs to stop and wait for them."""
        self._stop.set()
        if self.thread is not None:
            self.thread.join()

    def _in_background(self) -> None:
        store = self._store
        try:
            if _whole(store._read(fts.index_state)) or self._rebuild(require_exclusive=True):
                fts.respell_when_admitted(store.path, store._read, store._write, self._stop,
                                          before=self._refuse_on_damage)
                self._fill_search_index()
        except (HermesStateError, sqlite3.Error) as exc:
            logger.warning("FTS rebuild of %s stopped: %s", store.path, exc)

    def rebuild_now(self) -> None:
        """Rebuild the FTS indexes in the caller's thread (after the background jobs, if
        running, have finished), then fill or replace the search index. A handle without full
        FTS5 raises :class:`~hermes_state_errors.FullTextUnavailableError`."""
        level = self._store._read(fulltext.level_of)
        if level != fulltext.FULL:
            raise fulltext.unavailable(level, "FTS rebuild")
        if self.thread is not None:
            self.thread.join()
        path = self._store.path
        if not self._rebuild(require_exclusive=False):
            raise HermesStateError(f"another process is rebuilding the FTS index of {path}")
        if not self._fill_search_index():
            raise HermesStateError(
                f"the search index of {path} is being filled by another process, "
                "or is too damaged to be replaced in place"
            )

    def _fill_search_index(self) -> bool:
        store = self._store
        return impact.fill_when_admitted(store.path, store._read, store._write, self._stop,
                                         before=self._refuse_on_damage)

    def _rebuild(self, *, require_exclusive: bool) -> bool:
        store = self._store
        return fts.rebuild_when_admitted(
            store.path, store._read, store._write, self._stop,
            require_exclusive=require_exclusive, before=self._refuse_on_damage,
        )

    def _refuse_on_damage(self) -> None:
        """A rebuild reads every message and rewrites the indexes: on a file whose record is
        damaged it would write on and on into a corrupt file, so that file is quarantined
        instead (nothing is written) and the index stays detached."""
        store = self._store
        damaged = store._read(fts.damaged_canonical_tables)
        if damaged:
            error = StateDbCorruptError(
                f"{store.path} is damaged ({', '.join(damaged)} failed quick_check); "
                f"its full-text index is not rebuilt",
                path=store.path,
            )
            store._watch.enter(error)
            raise error


def _whole(state: fts.IndexState) -> bool:
    """Whether every index is usable and fed, the trigram one included."""
    return state.usable and state.trigram_stale is None


# --- the handle's methods (``SessionDB``) ------------------------------------------------------


class Handle(Protocol):
    """What the index methods need of a handle: its upkeep, and statements outside any
    transaction."""

    _upkeep: Upkeep

    def _outside_transaction(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...


def started_index_upkeep(db: Handle) -> bool:
    """Whether the open started the background upkeep of the indexes: a writable handle whose
    indexes needed work."""
    return db._upkeep.thread is not None


def wait_for_index(db: Handle, timeout: float | None = None) -> bool:
    """Wait up to ``timeout`` seconds (None: as long as it takes) for the background upkeep of
    the indexes to finish; True once none is running."""
    return db._upkeep.wait(timeout)


def rebuild_fts(db: Handle) -> None:
    """Rebuild the three FTS indexes now, in chunks, under the admission lock (after this
    handle's own background rebuild, if one is running, has finished); then finish the search
    index's fill, or replace it when damaged."""
    db._upkeep.rebuild_now()


def check_fts_integrity(db: Handle) -> dict[str, str | None]:
    """FTS5 'integrity-check' of each index (None: clean). Changes nothing, but SQLite runs it
    as a write, so it needs a writable handle and takes the write lock briefly."""
    return db._outside_transaction(fts.integrity_report)
