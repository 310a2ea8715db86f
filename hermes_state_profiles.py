"""Many profiles in one process: one shared store per profile home, held by explicit owners.

A :class:`ProfileStoreRegistry` binds each store to its home, which everything done for that
profile uses. Holds are counted per owner, and the store closes with the last release. A
successor acquires or takes over holds before its predecessor releases, so a retiring agent
never closes its successor's handle."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from hermes_state_home import (
    DB_FILENAME,
    get_hermes_home,
    hermes_home_override,
    hermes_root,
    resolve_profile_home,
)
from hermes_state_errors import (
    HermesStateError,
    InvalidTypeError,
    ProfileNotFoundError,
    StoreNotHeldError,
)

__all__ = [
    "ProfileStore",
    "ProfileStoreRegistry",
    "resolve_store_home",
    "collect_profile_stats",
]

PathArg = str | os.PathLike[str]


def _named_home(profile: str | None, home: PathArg | None) -> Path | None:
    """The home an explicit ``profile`` or ``home`` names (unchecked), None when neither."""
    if profile is not None and home is not None:
        raise InvalidTypeError("name a profile or a home directory, not both")
    if home is not None:
        return Path(home).expanduser().absolute()
    if profile is not None:
        return resolve_profile_home(profile).absolute()
    return None


def _home_key(profile: str | None, home: PathArg | None) -> Path:
    named = _named_home(profile, home)
    return (get_hermes_home() if named is None else named).resolve()


def resolve_store_home(profile: str | None = None, *, home: PathArg | None = None) -> Path:
    """The home directory work for ``profile`` (or ``home``) happens in; creates nothing.

    A profile name resolves under the root of this context's home (``"default"`` is the root
    itself); ``home`` is taken as given; with neither, this context's home, which may not
    exist yet. Raises :class:`UnsafePathError` for an invalid profile name and
    :class:`ProfileNotFoundError` when an explicit profile or home is not a directory (never
    created, or removed), before anything is opened or created for it.
    """
    named = _named_home(profile, home)
    if named is None:
        return get_hermes_home().resolve()
    if not named.is_dir():
        what = f"profile {profile!r}" if profile is not None else "home"
        raise ProfileNotFoundError(
            f"{what} has no directory at {named}", profile=profile, path=named
        )
    return named.resolve()


class ProfileStore(Protocol):
    """What a registry needs of a store: closing it."""

    def close(self) -> None: ...


S = TypeVar("S", bound=ProfileStore)


@dataclass
class _Held(Generic[S]):
    store: S
    # id(owner) -> (owner, holds); the owner is kept so that its id cannot be reused meanwhile.
    holds: dict[int, tuple[object, int]] = field(default_factory=dict)

    def add(self, owner: object, count: int = 1) -> None:
        self.holds[id(owner)] = (owner, self.holds.get(id(owner), (owner, 0))[1] + count)


class ProfileStoreRegistry(Generic[S]):
    """One shared store per profile home in this process, held by explicit owners.

    ``opener(db_path)`` opens a store on ``<home>/state.db`` (``SessionDB`` does; a read-only
    dashboard may pass ``functools.partial(SessionDB, read_only=True)``). Profiles are named as
    in :func:`resolve_store_home`. Thread-safe: opening or closing one home's store never
    waits for another home's.
    """

    def __init__(self, opener: Callable[[Path], S]) -> None:
        self._opener = opener
        self._lock = threading.Lock()
        self._home_locks: dict[Path, threading.Lock] = {}
        self._held: dict[Path, _Held[S]] = {}

    def _home_lock(self, key: Path) -> threading.Lock:
        """Serialises opening and closing the store of one home."""
        with self._lock:
            return self._home_locks.setdefault(key, threading.Lock())

    def acquire(
        self, profile: str | None = None, *, home: PathArg | None = None, owner: object
    ) -> S:
        """The profile's shared store, opened on first use, with one more hold for ``owner``.

        Fails (:class:`UnsafePathError`, :class:`ProfileNotFoundError`) before anything is
        opened or created when an explicit profile or home cannot be resolved."""
        return self._acquire(resolve_store_home(profile, home=home), owner)

    def _acquire(self, key: Path, owner: object) -> S:
        with self._home_lock(key):
            with self._lock:
                held = self._held.get(key)
            if held is None:
                held = _Held(self._opener(key / DB_FILENAME))
                with self._lock:
                    self._held[key] = held
            with self._lock:
                held.add(owner)
            return held.store

    def release(
        self, owner: object, profile: str | None = None, *, home: PathArg | None = None
    ) -> bool:
        """Drop one of ``owner``'s holds; the last hold closes the store (returns True then).

        Raises :class:`StoreNotHeldError` when ``owner`` holds nothing there. Works for a
        profile whose directory has meanwhile been removed."""
        return self._release(_home_key(profile, home), owner)

    def _release(self, key: Path, owner: object) -> bool:
        with self._home_lock(key):
            with self._lock:
                held = self._held.get(key)
                if held is None or id(owner) not in held.holds:
                    raise StoreNotHeldError(f"{owner!r} holds no store for {key}")
                _, count = held.holds[id(owner)]
                if count > 1:
                    held.holds[id(owner)] = (owner, count - 1)
                else:
                    del held.holds[id(owner)]
                if held.holds:
                    return False
                del self._held[key]
            held.store.close()
            return True

    def transfer(
        self,
        from_owner: object,
        to_owner: object,
        profile: str | None = None,
        *,
        home: PathArg | None = None,
    ) -> S:
        """Move all of ``from_owner``'s holds on the store to ``to_owner`` in one step (the
        store stays open throughout) and return it. Raises :class:`StoreNotHeldError`, moving
        nothing, when ``from_owner`` holds nothing there."""
        key = _home_key(profile, home)
        with self._lock:
            held = self._held.get(key)
            if held is None or id(from_owner) not in held.holds:
                raise StoreNotHeldError(f"{from_owner!r} holds no store for {key}")
            _, count = held.holds.pop(id(from_owner))
            held.add(to_owner, count)
            return held.store

    @contextlib.contextmanager
    def holding(
        self, profile: str | None = None, *, home: PathArg | None = None, owner: object
    ) -> Iterator[S]:
        """Acquire the store for the block, with this context's home bound to the profile's
        (``hermes_home_override``), so work done inside resolves that profile's paths; the
        hold is released on exit."""
        key = resolve_store_home(profile, home=home)
        store = self._acquire(key, owner)
        try:
            with hermes_home_override(key):
                yield store
        finally:
            self._release(key, owner)

    def holds(
        self, owner: object, profile: str | None = None, *, home: PathArg | None = None
    ) -> int:
        """How many holds ``owner`` has on the store (0 when none, or when it is not open)."""
        key = _home_key(profile, home)
        with self._lock:
            held = self._held.get(key)
            return 0 if held is None else held.holds.get(id(owner), (owner, 0))[1]

    def open_homes(self) -> list[Path]:
        """The homes whose stores are open, sorted."""
        with self._lock:
            return sorted(self._held)

    def close_all(self) -> None:
        """Close every store regardless of its holders (process shutdown)."""
        with self._lock:
            every = list(self._held.items())
            self._held.clear()
        for key, held in every:
            with self._home_lock(key):
                held.store.close()


def collect_profile_stats(
    root: PathArg | None, open_read_only: Callable[[Path], Any]
) -> dict[str, Any]:
    """``stats()`` of every profile under ``root`` (default: the Hermes root): ``default``
    (``<root>/state.db``) and each ``<root>/profiles/<name>/state.db``, each opened with
    ``open_read_only(path)``. A profile that fails goes to ``errors`` (``profile``, ``error``
    and the unavailable ``reason`` when there is one); the others are still returned."""
    base = hermes_root() if root is None else Path(root).expanduser()
    names = ["default"]
    profiles = base / "profiles"
    if profiles.is_dir():
        names += sorted(
            p.name
            for p in profiles.iterdir()
            if (p / DB_FILENAME).exists() or (p / DB_FILENAME).is_symlink()
        )
    result: dict[str, Any] = {"profiles": {}, "errors": []}
    for name in names:
        try:
            home = resolve_profile_home(name, base)
            with open_read_only(home / DB_FILENAME) as db:
                result["profiles"][name] = db.stats()
        except (HermesStateError, OSError) as exc:
            entry: dict[str, Any] = {"profile": name, "error": str(exc)}
            reason = getattr(exc, "reason", None)
            if reason:
                entry["reason"] = reason
            result["errors"].append(entry)
    return result
