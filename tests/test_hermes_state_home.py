"""Home resolution, profiles, the environment of child processes and the test-isolation guard."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import hermes_state_testguard as testguard
from hermes_state import (
    SessionDB,
    UnsafePathError,
    child_process_env,
    display_hermes_home,
    get_hermes_home,
    hermes_home_override,
    resolve_profile_home,
)

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX platform default")


@pytest.fixture
def fake_user_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HOME points at an empty temporary directory and HERMES_HOME is unset."""
    user_home = tmp_path / "user-home"
    user_home.mkdir()
    monkeypatch.setenv("HOME", str(user_home))
    monkeypatch.delenv("HERMES_HOME", raising=False)
    return user_home


# --- precedence ------------------------------------------------------------------------------


@posix_only
def test_platform_default_is_dot_hermes_under_home(fake_user_home: Path) -> None:
    assert get_hermes_home() == fake_user_home / ".hermes"


def test_hermes_home_env_beats_the_platform_default(
    hermes_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "elsewhere"))
    assert get_hermes_home() == hermes_home


@posix_only
def test_hermes_home_env_expands_the_tilde(
    fake_user_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_HOME", "~/custom-home")
    assert get_hermes_home() == fake_user_home / "custom-home"


def test_empty_hermes_home_env_means_unset(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("HERMES_HOME", "")
    assert get_hermes_home() == tmp_path / ".hermes"


def test_override_beats_hermes_home_env(hermes_home: Path, tmp_path: Path) -> None:
    with hermes_home_override(tmp_path / "override") as home:
        assert home == tmp_path / "override"
        assert get_hermes_home() == tmp_path / "override"
    assert get_hermes_home() == hermes_home


def test_overrides_nest_and_unwind(hermes_home: Path, tmp_path: Path) -> None:
    with hermes_home_override(tmp_path / "outer"):
        with hermes_home_override(tmp_path / "inner"):
            assert get_hermes_home() == tmp_path / "inner"
        assert get_hermes_home() == tmp_path / "outer"
    assert get_hermes_home() == hermes_home


@posix_only
def test_home_only_changes_the_default(
    fake_user_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other-user"
    monkeypatch.setenv("HOME", str(other))
    assert get_hermes_home() == other / ".hermes"
    monkeypatch.setenv("HERMES_HOME", str(tmp_path / "explicit"))
    monkeypatch.setenv("HOME", str(fake_user_home))
    assert get_hermes_home() == tmp_path / "explicit"


def test_override_is_private_to_each_thread(hermes_home: Path, tmp_path: Path) -> None:
    barrier = threading.Barrier(3)
    seen: dict[str, tuple[Path, Path]] = {}

    def worker(name: str) -> None:
        with hermes_home_override(tmp_path / name):
            barrier.wait()  # every thread is inside its override now
            with SessionDB() as db:
                seen[name] = (get_hermes_home(), db.path)
            barrier.wait()

    threads = [threading.Thread(target=worker, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    barrier.wait()
    assert get_hermes_home() == hermes_home  # the main thread sees neither override
    barrier.wait()
    for t in threads:
        t.join()
    assert seen == {
        "a": (tmp_path / "a", tmp_path / "a" / "state.db"),
        "b": (tmp_path / "b", tmp_path / "b" / "state.db"),
    }


def test_override_is_private_to_each_asyncio_task(hermes_home: Path, tmp_path: Path) -> None:
    async def task(name: str, started: asyncio.Event, both: asyncio.Event) -> Path:
        with hermes_home_override(tmp_path / name):
            started.set()
            await both.wait()
            await asyncio.sleep(0)
            return get_hermes_home()

    async def main() -> tuple[list[Path], Path]:
        events = [asyncio.Event(), asyncio.Event()]
        both = asyncio.Event()
        tasks = [asyncio.create_task(task(n, e, both)) for n, e in zip("ab", events)]
        for e in events:
            await e.wait()
        outside = get_hermes_home()
        both.set()
        return list(await asyncio.gather(*tasks)), outside

    homes, outside = asyncio.run(main())
    assert homes == [tmp_path / "a", tmp_path / "b"]
    assert outside == hermes_home


# --- the default database path ---------------------------------------------------------------


def test_default_db_path_follows_hermes_home_set_after_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    later = tmp_path / "set-after-import"
    monkeypatch.setenv("HERMES_HOME", str(later))
    with SessionDB() as db:
        assert db.path == later / "state.db"
    assert (later / "state.db").is_file()


def test_default_db_path_follows_the_override(tmp_path: Path, hermes_home: Path) -> None:
    with hermes_home_override(tmp_path / "ctx"), SessionDB() as db:
        assert db.path == tmp_path / "ctx" / "state.db"
        db.create_session("s1", "cli")
    assert not (hermes_home / "state.db").exists()
    with SessionDB(tmp_path / "ctx" / "state.db") as again:
        assert again.get_session("s1") is not None


# --- profiles --------------------------------------------------------------------------------


def test_profile_home_is_under_the_root(hermes_home: Path) -> None:
    assert resolve_profile_home("coder") == hermes_home / "profiles" / "coder"
    assert resolve_profile_home("default") == hermes_home


def test_profile_inside_a_profile_resolves_a_sibling(
    hermes_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HERMES_HOME", str(hermes_home / "profiles" / "coder"))
    assert resolve_profile_home("writer") == hermes_home / "profiles" / "writer"
    assert resolve_profile_home("default") == hermes_home


def test_profiles_have_separate_databases(hermes_home: Path) -> None:
    coder, writer = resolve_profile_home("coder"), resolve_profile_home("writer")
    with hermes_home_override(coder), SessionDB() as db:
        db.create_session("only-in-coder", "cli")
    with hermes_home_override(writer), SessionDB() as db:
        assert db.path == writer / "state.db"
        assert db.get_session("only-in-coder") is None
        assert db.session_count() == 0
    with SessionDB(coder / "state.db") as db:
        assert db.get_session("only-in-coder") is not None
    assert not (hermes_home / "state.db").exists()


@pytest.mark.parametrize(
    "name", ["..", "a/b", "", "/abs", ".", "a\\b", "../x", "x/..", ".hidden", "a" * 65, "a\0b"]
)
def test_unsafe_profile_names_are_rejected(name: str, hermes_home: Path) -> None:
    with pytest.raises(UnsafePathError) as info:
        resolve_profile_home(name)
    assert isinstance(info.value, ValueError)
    assert not (hermes_home / "profiles").exists()


def test_profile_symlinked_out_of_the_root_is_rejected(hermes_home: Path, tmp_path: Path) -> None:
    (hermes_home / "profiles").mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (hermes_home / "profiles" / "evil").symlink_to(outside)
    with pytest.raises(UnsafePathError):
        resolve_profile_home("evil")


@posix_only
def test_display_home_is_relative_to_the_user_home(fake_user_home: Path) -> None:
    assert display_hermes_home() == "~/.hermes"
    profile = resolve_profile_home("coder")
    assert display_hermes_home(profile) == "~/.hermes/profiles/coder"
    with hermes_home_override(profile):
        assert display_hermes_home() == "~/.hermes/profiles/coder"


def test_display_home_outside_the_user_home_is_the_plain_path(
    hermes_home: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "user-home"))
    assert display_hermes_home() == str(hermes_home)


# --- child processes -------------------------------------------------------------------------

PRINT_HOME = "from hermes_state import get_hermes_home; print(get_hermes_home())"


def test_child_env_carries_hermes_home_explicitly(run_python, tmp_path: Path) -> None:
    profile = resolve_profile_home("coder")
    with hermes_home_override(profile):
        env = child_process_env(base={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert env["HERMES_HOME"] == str(profile)
    assert env["HOME"] == str(tmp_path)
    result = run_python(PRINT_HOME, env={"HERMES_HOME": env["HERMES_HOME"], "HOME": env["HOME"]})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(profile)


def test_child_env_replaces_an_inherited_hermes_home(hermes_home: Path, tmp_path: Path) -> None:
    env = child_process_env(tmp_path / "target", base={"HERMES_HOME": "/somewhere/else"})
    assert env["HERMES_HOME"] == str(tmp_path / "target")
    assert child_process_env()["HERMES_HOME"] == str(hermes_home)


# --- the test-isolation guard ----------------------------------------------------------------
#
# The production root is the account's own home (from the password database), whatever HOME
# says. The tests name paths under it, but only the guard ever sees them: it refuses before any
# file is created, and a test that would lift the guard there checks the guard alone.

OPEN_DEFAULT = """
import json
from hermes_state import SessionDB
try:
    with SessionDB() as db:
        print(json.dumps({"opened": str(db.path)}))
except RuntimeError as exc:
    print(json.dumps({"refused": str(exc)}))
"""

OPEN_PATH = """
import json, sys
from hermes_state import SessionDB
try:
    SessionDB(sys.argv[1]).close()
    print(json.dumps({"opened": sys.argv[1]}))
except RuntimeError as exc:
    print(json.dumps({"refused": str(exc)}))
"""

# The guard alone, on the default store's path: nothing is opened either way.
CHECK_DEFAULT = """
import json
from hermes_state_home import default_db_path
from hermes_state_testguard import check_test_isolation
try:
    check_test_isolation(default_db_path())
    print(json.dumps({"allowed": str(default_db_path())}))
except RuntimeError as exc:
    print(json.dumps({"refused": str(exc)}))
"""


def _guarded_env(user_home: Path, **extra: str | None) -> dict[str, str | None]:
    return {
        "HOME": str(user_home),
        "HERMES_HOME": None,
        "PYTEST_CURRENT_TEST": "test_x.py::test_y (call)",
        "HERMES_STATE_DB_GUARD_BYPASS": None,
        **extra,
    }


def _files_under(path: Path) -> list[Path]:
    return sorted(path.rglob("*"))


def _existing(paths: list[Path]) -> list[bool]:
    return [p.exists() for p in paths]


@pytest.fixture
def real_root() -> Path:
    """The account's own default root (its home from the password database)."""
    import pwd  # POSIX only, like the tests that use it

    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".hermes"


@posix_only
def test_guard_refuses_the_real_default_database_in_a_test_subprocess(
    run_python, real_root: Path
) -> None:
    before = _existing([real_root, real_root / "state.db"])
    result = run_python(OPEN_DEFAULT, env=_guarded_env(real_root.parent))
    assert result.returncode == 0, result.stderr
    assert "refused" in json.loads(result.stdout)
    assert _existing([real_root, real_root / "state.db"]) == before


@posix_only
def test_guard_allows_a_temporary_home_even_without_hermes_home(
    run_python, tmp_path: Path
) -> None:
    """Tests point HOME at a temporary folder and open <tmp>/.hermes/state.db."""
    user_home = tmp_path / "user-home"
    user_home.mkdir()
    result = run_python(OPEN_DEFAULT, env=_guarded_env(user_home))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"opened": str(user_home / ".hermes" / "state.db")}


@posix_only
def test_a_path_under_the_temporary_directory_is_never_production(
    tmp_path: Path, real_root: Path
) -> None:
    scratch = tmp_path / ".hermes"
    assert not testguard.is_production_db_path(scratch / "state.db", root=scratch)
    assert testguard.is_production_db_path(real_root / "state.db")


@posix_only
@pytest.mark.parametrize(
    "relative",
    ["profiles/coder/state.db", "x/../state.db", "profiles/coder/../writer/state.db"],
)
def test_guard_refuses_production_paths_however_spelled(
    run_python, tmp_path: Path, real_root: Path, relative: str
) -> None:
    target = real_root / relative
    before = _existing([real_root, target])
    user_home = tmp_path / "user-home"
    user_home.mkdir()
    result = run_python(OPEN_PATH, str(target), env=_guarded_env(user_home))
    assert result.returncode == 0, result.stderr
    assert "refused" in json.loads(result.stdout)
    assert _existing([real_root, target]) == before


@posix_only
def test_guard_refuses_a_path_reaching_production_through_a_symlinked_directory(
    run_python, tmp_path: Path, real_root: Path
) -> None:
    link = tmp_path / "innocent-looking"
    link.symlink_to(real_root)
    before = _existing([real_root, real_root / "state.db"])
    result = run_python(OPEN_PATH, str(link / "state.db"), env=_guarded_env(tmp_path))
    assert "refused" in json.loads(result.stdout)
    assert _existing([real_root, real_root / "state.db"]) == before


@posix_only
def test_guard_env_bypass_lets_a_child_through(run_python, real_root: Path) -> None:
    env = _guarded_env(real_root.parent, HERMES_STATE_DB_GUARD_BYPASS="1")
    result = run_python(CHECK_DEFAULT, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"allowed": str(real_root / "state.db")}
    assert "refused" in json.loads(run_python(CHECK_DEFAULT, env=_guarded_env(
        real_root.parent)).stdout)


@posix_only
def test_guard_allows_a_temporary_hermes_home_in_a_test_subprocess(
    run_python, tmp_path: Path, real_root: Path
) -> None:
    env = _guarded_env(real_root.parent, HERMES_HOME=str(tmp_path / "scratch"))
    result = run_python(OPEN_DEFAULT, env=env)
    assert json.loads(result.stdout) == {"opened": str(tmp_path / "scratch" / "state.db")}


@posix_only
def test_guard_is_off_outside_pytest(run_python, real_root: Path) -> None:
    env = _guarded_env(real_root.parent, PYTEST_CURRENT_TEST=None)
    result = run_python(CHECK_DEFAULT, env=env)
    assert json.loads(result.stdout) == {"allowed": str(real_root / "state.db")}


@posix_only
@pytest.mark.live_system_guard_bypass
def test_marker_lifts_the_guard(real_root: Path) -> None:
    testguard.check_test_isolation(real_root / "state.db")
    testguard.check_test_isolation(real_root / "profiles" / "coder" / "state.db")


@pytest.fixture
def guard_checked_at_setup(real_root: Path) -> Iterator[Path]:
    testguard.check_test_isolation(real_root / "state.db")
    yield real_root
    testguard.check_test_isolation(real_root / "state.db")


@posix_only
@pytest.mark.live_system_guard_bypass
def test_marker_covers_fixture_setup_and_teardown(guard_checked_at_setup: Path) -> None:
    testguard.check_test_isolation(guard_checked_at_setup / "state.db")


@posix_only
def test_without_the_marker_the_real_default_database_is_refused(
    real_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(real_root.parent))
    monkeypatch.delenv("HERMES_HOME", raising=False)
    before = _existing([real_root, real_root / "state.db"])
    with pytest.raises(RuntimeError, match="production"):
        SessionDB()
    with pytest.raises(RuntimeError):
        SessionDB(real_root / "profiles" / "coder" / "state.db")
    with pytest.raises(RuntimeError):
        SessionDB("~/.hermes/state.db", read_only=True)
    assert _existing([real_root, real_root / "state.db"]) == before

