"""Where a store lives: the home, the named profiles under it, and the paths derived from them.

:func:`get_hermes_home` is the one authority: a context-local override, then ``HERMES_HOME``,
then the default. Derived paths are computed at call time, never at import. Profiles live in
``<root>/profiles/<name>/``; from inside a profile, a sibling resolves beside it."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from pathlib import Path

from hermes_state_common import clean_text
from hermes_state_errors import InvalidInputError, InvalidTypeError, UnsafePathError

__all__ = [
    "DB_FILENAME",
    "MEMORY_NAME",
    "append_error_log",
    "child_process_env",
    "default_db_path",
    "display_hermes_home",
    "get_hermes_home",
    "hermes_home_override",
    "hermes_root",
    "platform_default_home",
    "profile_config_path",
    "resolve_profile_home",
    "store_path",
    "validate_profile_name",
]


DB_FILENAME = "state.db"
CONFIG_FILENAME = "config.yaml"

_home_override: ContextVar[Path | None] = ContextVar("hermes_home_override", default=None)


def platform_default_home() -> Path:
    """``~/.hermes`` on macOS and Linux, ``%LOCALAPPDATA%/hermes`` on Windows."""
    if sys.platform == "win32":
        local = os.environ.get("LOCALAPPDATA")
        if local:
            return Path(local) / "hermes"
        return Path.home() / "AppData" / "Local" / "hermes"
    return Path.home() / ".hermes"


def get_hermes_home() -> Path:
    """The directory that holds this process's (or this context's) state and config."""
    override = _home_override.get()
    if override is not None:
        return override
    env = os.environ.get("HERMES_HOME")
    if env:
        return Path(env).expanduser()
    return platform_default_home()


@contextlib.contextmanager
def hermes_home_override(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Make :func:`get_hermes_home` return ``path`` inside this context only.

    The override follows the current thread or asyncio task (a ``ContextVar``): other threads
    and tasks keep resolving their own home.
    """
    home = Path(path).expanduser()
    token = _home_override.set(home)
    try:
        yield home
    finally:
        _home_override.reset(token)


def hermes_root(home: Path | None = None) -> Path:
    """The root that named profiles live under (see the module docstring)."""
    home = get_hermes_home() if home is None else home
    if home.parent.name == "profiles":
        return home.parent.parent
    return home


def default_db_path() -> Path:
    return get_hermes_home() / DB_FILENAME


# What sqlite3.connect takes for a private in-memory database (a store refuses it).
MEMORY_NAME = ":memory:"


def store_path(db_path: object) -> Path:
    """The file a handle opens: ``db_path``, or the default store's when it is None."""
    if db_path is None:
        return default_db_path()
    if not isinstance(db_path, str | os.PathLike):
        raise InvalidTypeError(
            f"db_path must be a str or a path, got {type(db_path).__name__}", argument="db_path")
    if os.fspath(db_path) == MEMORY_NAME:
        raise InvalidInputError(
            f"db_path {MEMORY_NAME!r} names SQLite's in-memory database, which the store does "
            "not offer: its processes and connections share one file, so pass that file's path",
            argument="db_path")
    return Path(db_path).expanduser()


_PROFILE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def validate_profile_name(name: str) -> str:
    """Return ``name`` if it is a safe profile name, else raise :class:`UnsafePathError`.

    A name is 1–64 characters of letters, digits, ``.``, ``_`` and ``-``, starting with a letter
    or digit; so no separators, no ``..``, nothing absolute and nothing empty.
    """
    if not isinstance(name, str) or not _PROFILE_NAME_RE.fullmatch(name) or ".." in name:
        raise UnsafePathError(f"invalid profile name: {name!r}", path=str(name))
    return name


def resolve_profile_home(name: str, root: Path | None = None) -> Path:
    """The home directory of profile ``name``; ``"default"`` is the root itself.

    The result is checked to stay under ``<root>/profiles`` after resolving symlinks.
    """
    validate_profile_name(name)
    root = hermes_root() if root is None else Path(root).expanduser()
    if name == "default":
        return root
    profiles = root / "profiles"
    home = profiles / name
    resolved_profiles = profiles.resolve()
    if not home.resolve().is_relative_to(resolved_profiles):
        raise UnsafePathError(f"profile {name!r} escapes {profiles}", path=home)
    return home


def profile_config_path(profile_home: str | os.PathLike[str]) -> Path:
    """The configuration file of the profile whose home is ``profile_home``."""
    return Path(profile_home) / CONFIG_FILENAME


def display_hermes_home(home: Path | None = None) -> str:
    """Format a home for people to read (``~/.hermes/profiles/coder``); display only."""
    home = get_hermes_home() if home is None else Path(home)
    try:
        return "~/" + home.relative_to(Path.home()).as_posix()
    except ValueError:
        return str(home)


def child_process_env(
    home: Path | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment for a child process that must work in ``home`` (default: this context's).

    ``HERMES_HOME`` is always set explicitly: a child that inherited only ``HOME`` would fall
    back to the default profile.
    """
    env = dict(os.environ if base is None else base)
    env["HERMES_HOME"] = str(get_hermes_home() if home is None else home)
    return env


ERROR_LOG_DIR, ERROR_LOG_NAME = "logs", "errors.log"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def append_error_log(line: str, home: Path | None = None) -> None:
    """Append one timestamped line to ``<home>/logs/errors.log`` (private file; ``home``
    defaults to this context's); never raises.

    Neither ``logs`` nor ``errors.log`` may be a symlink (as the database, its sidecars and
    the spools may not): the directory is opened ``O_NOFOLLOW|O_DIRECTORY`` and the file
    ``O_NOFOLLOW`` relative to it, so no planted link is followed out of the home; a refused
    or failed write is a warning on the ``hermes_state`` logger instead."""
    try:
        logs = (get_hermes_home() if home is None else home) / ERROR_LOG_DIR
        logs.mkdir(parents=True, exist_ok=True, mode=0o700)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        directory = os.open(logs, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW)
        try:
            fd = os.open(ERROR_LOG_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW,
                         0o600, dir_fd=directory)
        finally:
            os.close(directory)
        try:
            os.write(fd, f"{stamp} {clean_text(line)}\n".encode())
        finally:
            os.close(fd)
    except OSError as exc:
        refused = exc.errno in (errno.ELOOP, errno.EEXIST, errno.ENOTDIR)
        logging.getLogger("hermes_state").warning(
            "%s: %s", "refusing a symlink as the error log" if refused
            else f"the error log could not be written ({exc})", line)
