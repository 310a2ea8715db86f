"""The test-isolation guard: a process under pytest never opens a production store.

Opening the account's real home (from the password database, not ``HOME``) raises
``RuntimeError`` before any file is touched. Tests escape it only through
``HERMES_STATE_DB_GUARD_BYPASS=1`` or the ``live_system_guard_bypass`` marker."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from hermes_state_home import platform_default_home

__all__ = [
    "GUARD_BYPASS_ENV",
    "real_default_root",
    "is_production_db_path",
    "check_test_isolation",
    "bypassed_in_process",
]

GUARD_BYPASS_ENV = "HERMES_STATE_DB_GUARD_BYPASS"

# True while the plugin runs a test marked ``live_system_guard_bypass``.
_bypassed = False


def _running_under_pytest() -> bool:
    return "PYTEST_CURRENT_TEST" in os.environ or "pytest" in sys.modules


def real_default_root() -> Path:
    """The platform default home of the account itself: on POSIX ``.hermes`` under the home
    directory of the password database's entry for this user (``HOME`` is what a test
    changes), elsewhere the platform default."""
    if sys.platform == "win32":
        return platform_default_home()
    try:
        import pwd

        return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".hermes"
    except (ImportError, KeyError):  # no entry for this user: the environment is all there is
        return platform_default_home()


def _resolved(path: Path) -> Path:
    try:
        return path.expanduser().resolve()
    except (OSError, RuntimeError):  # a symlink loop: the normalised spelling
        return Path(os.path.abspath(path.expanduser()))


def is_production_db_path(db_path: Path, root: Path | None = None) -> bool:
    """True when ``db_path`` is the database of ``root`` (default: the real default root) or
    of one of its profiles; never for a path under the system's temporary directory.

    Both sides are resolved first, so neither ``..`` components nor a symlinked directory can
    spell a production path in a way the comparison misses.
    """
    target = _resolved(db_path)
    root = _resolved(real_default_root() if root is None else root)
    if target.is_relative_to(_resolved(Path(tempfile.gettempdir()))):
        return False
    try:
        rel = target.parent.relative_to(root)
    except ValueError:
        return False
    parts = rel.parts
    return parts == () or (len(parts) == 2 and parts[0] == "profiles")


def check_test_isolation(db_path: Path) -> None:
    """Refuse, under pytest, to open a production database (RuntimeError, nothing touched)."""
    if not _running_under_pytest() or _bypassed:
        return
    if os.environ.get(GUARD_BYPASS_ENV) == "1":
        return
    if is_production_db_path(db_path):
        raise RuntimeError(
            f"refusing to open the production database {db_path} from a test: point "
            f"HERMES_HOME or db_path at a temporary directory"
        )


@contextlib.contextmanager
def bypassed_in_process(bypass: bool = True) -> Iterator[None]:
    """Lift the guard in this process for the duration of the block (when ``bypass``)."""
    global _bypassed
    previous = _bypassed
    _bypassed = bypass or previous
    try:
        yield
    finally:
        _bypassed = previous
