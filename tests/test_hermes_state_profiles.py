"""Many profiles in one process: one shared store per profile home, explicit owners."""

from __future__ import annotations

import contextlib
import functools
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hermes_state import (
    ProfileNotFoundError,
    ProfileStoreRegistry,
    SessionDB,
    StateDbClosedError,
    StateDbCorruptError,
    StoreNotHeldError,
    UnsafePathError,
    child_process_env,
    get_hermes_home,
    hermes_home_override,
    profile_config_path,
    profile_stores,
)


class Owner:
    """An agent, as far as the registry is concerned: any object."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Owner({self.name})"


@pytest.fixture
def root(hermes_home: Path) -> Path:
    return hermes_home.resolve()


@pytest.fixture
def coder(root: Path) -> Path:
    home = root / "profiles" / "coder"
    home.mkdir(parents=True)
    return home


@pytest.fixture
def writer(root: Path) -> Path:
    home = root / "profiles" / "writer"
    home.mkdir(parents=True)
    return home


@pytest.fixture
def registry() -> Iterator[ProfileStoreRegistry[SessionDB]]:
    stores: ProfileStoreRegistry[SessionDB] = ProfileStoreRegistry(
        opener=functools.partial(SessionDB, rebuild_fts=False)
    )
    try:
        yield stores
    finally:
        stores.close_all()


def session_ids(db_file: Path) -> set[str]:
    """The sessions of one file, read with a plain connection of its own."""
    raw = sqlite3.connect(db_file)
    try:
        return {r[0] for r in raw.execute("SELECT id FROM sessions")}
    finally:
        raw.close()


def tree(directory: Path) -> set[Path]:
    return set(directory.rglob("*"))


# ---------------------------------------------------------------------------------------------
# One shared store per profile home
# ---------------------------------------------------------------------------------------------


def test_one_shared_store_per_profile_home_bound_to_that_home(
    registry: ProfileStoreRegistry[SessionDB], coder: Path, writer: Path
) -> None:
    a, b, c = Owner("a"), Owner("b"), Owner("c")
    by_name = registry.acquire("coder", owner=a)
    by_home = registry.acquire(home=coder, owner=b)
    other = registry.acquire("writer", owner=c)

    assert by_name is by_home
    assert by_name.profile_home == coder
    assert by_name.path == coder / "state.db"
    assert other is not by_name and other.profile_home == writer
    assert registry.open_homes() == [coder, writer]
    assert registry.holds(a, "coder") == registry.holds(b, "coder") == 1


def test_the_default_profile_is_the_root_and_no_profile_is_the_current_context(
    registry: ProfileStoreRegistry[SessionDB], root: Path, coder: Path
) -> None:
    owner = Owner("o")
    assert registry.acquire("default", owner=owner).profile_home == root
    with hermes_home_override(coder):
        assert registry.acquire(owner=owner).profile_home == coder
    assert registry.acquire(owner=owner).profile_home == root


def test_a_profile_and_a_home_together_are_refused(
    registry: ProfileStoreRegistry[SessionDB], coder: Path
) -> None:
    with pytest.raises(TypeError):
        registry.acquire("coder", home=coder, owner=Owner("o"))
    assert registry.open_homes() == []


def test_the_ready_made_registry_opens_session_stores(root: Path, coder: Path) -> None:
    owner = Owner("o")
    db = profile_stores.acquire("coder", owner=owner)
    try:
        assert isinstance(db, SessionDB) and db.profile_home == coder
    finally:
        assert profile_stores.release(owner, "coder") is True
    assert db.closed


def test_two_profiles_write_concurrently_from_threads_each_into_its_own_file(
    registry: ProfileStoreRegistry[SessionDB], root: Path, coder: Path, writer: Path
) -> None:
    per_thread = 40
    start = threading.Barrier(4)
    errors: list[BaseException] = []

    def work(label: str, context: Path | None, acquire: Callable[[Owner], SessionDB]) -> None:
        owner = Owner(label)
        try:
            with hermes_home_override(context) if context else contextlib.nullcontext():
                db = acquire(owner)
                start.wait(timeout=10)
                for i in range(per_thread):
                    session_id = f"{label}-{i}"
                    db.create_session(session_id, "cli")
                    db.append_message(session_id, "user", f"message {i} from {label}")
                registry.release(owner, home=db.profile_home)
        except BaseException as exc:  # reported on the main thread
            errors.append(exc)
            start.abort()

    threads = [
        # inside coder's override, no profile named: the context's home
        threading.Thread(target=work, args=(
            "coder_ctx", coder, lambda o: registry.acquire(owner=o))),
        # no override at all, writer named explicitly
        threading.Thread(target=work, args=(
            "writer_plain", None, lambda o: registry.acquire("writer", owner=o))),
        # inside coder's override, writer named: a sibling under the same root
        threading.Thread(target=work, args=(
            "writer_from_coder", coder, lambda o: registry.acquire("writer", owner=o))),
        # inside writer's override, coder's home given
        threading.Thread(target=work, args=(
            "coder_from_writer", writer, lambda o: registry.acquire(home=coder, owner=o))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert registry.open_homes() == [], "every hold was released, so every store closed"

    def expected(*labels: str) -> set[str]:
        return {f"{label}-{i}" for label in labels for i in range(per_thread)}

    assert session_ids(coder / "state.db") == expected("coder_ctx", "coder_from_writer")
    assert session_ids(writer / "state.db") == expected("writer_plain", "writer_from_coder")
    assert not (root / "state.db").exists(), "nothing fell back to the default root"


# ---------------------------------------------------------------------------------------------
# Ownership
# ---------------------------------------------------------------------------------------------


def test_a_retiring_holder_releasing_after_its_successor_acquired_leaves_the_handle_usable(
    registry: ProfileStoreRegistry[SessionDB], coder: Path
) -> None:
    retiring, successor = Owner("retiring"), Owner("successor")
    db = registry.acquire("coder", owner=retiring)
    db.create_session("s1", "cli")
    assert registry.acquire("coder", owner=successor) is db

    assert registry.release(retiring, "coder") is False
    assert not db.closed
    db.append_message("s1", "user", "the successor keeps writing")

    assert registry.release(successor, "coder") is True
    assert db.closed
    with pytest.raises(StateDbClosedError):
        db.append_message("s1", "user", "too late")


def test_transfer_moves_every_hold_in_one_step_and_the_last_release_closes(
    registry: ProfileStoreRegistry[SessionDB], coder: Path
) -> None:
    retiring, successor = Owner("retiring"), Owner("successor")
    db = registry.acquire("coder", owner=retiring)
    registry.acquire("coder", owner=retiring)
    db.create_session("s1", "cli")

    assert registry.transfer(retiring, successor, "coder") is db
    assert registry.holds(retiring, "coder") == 0
    assert registry.holds(successor, "coder") == 2
    with pytest.raises(StoreNotHeldError):
        registry.release(retiring, "coder")
    assert not db.closed
    db.append_message("s1", "user", "still open after the retiring agent let go")

    assert registry.release(successor, "coder") is False
    assert registry.release(successor, "coder") is True
    assert db.closed


def test_a_successor_that_failed_to_get_ready_leaves_the_clean_up_to_the_retiring_holder(
    registry: ProfileStoreRegistry[SessionDB], coder: Path
) -> None:
    retiring, successor = Owner("retiring"), Owner("successor")
    db = registry.acquire("coder", owner=retiring)
    with pytest.raises(StoreNotHeldError):
        registry.transfer(successor, retiring, "coder")  # the successor holds nothing
    assert registry.holds(retiring, "coder") == 1 and not db.closed
    assert registry.release(retiring, "coder") is True
    assert db.closed


def test_releasing_what_one_does_not_hold_is_refused_and_changes_nothing(
    registry: ProfileStoreRegistry[SessionDB], coder: Path
) -> None:
    holder, stranger = Owner("holder"), Owner("stranger")
    with pytest.raises(StoreNotHeldError):
        registry.release(stranger, "coder")
    db = registry.acquire("coder", owner=holder)
    with pytest.raises(StoreNotHeldError):
        registry.release(stranger, "coder")
    assert not db.closed and registry.holds(holder, "coder") == 1


def test_a_release_still_works_after_the_profile_directory_was_removed(
    registry: ProfileStoreRegistry[SessionDB], root: Path
) -> None:
    home = root / "profiles" / "brief"
    home.mkdir(parents=True)
    owner = Owner("o")
    registry.acquire("brief", owner=owner)
    for f in home.iterdir():
        f.unlink()
    home.rmdir()
    assert registry.release(owner, "brief") is True


def test_holders_on_many_threads_never_use_a_closed_handle(
    registry: ProfileStoreRegistry[SessionDB], coder: Path
) -> None:
    with registry.holding("coder", owner=Owner("setup")) as db:
        db.create_session("s1", "cli")
    rounds, workers = 15, 6
    errors: list[BaseException] = []

    def churn(n: int) -> None:
        try:
            for i in range(rounds):
                owner = Owner(f"{n}-{i}")
                db = registry.acquire("coder", owner=owner)
                db.append_message("s1", "user", f"{n}-{i}")
                registry.release(owner, "coder")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(n,)) for n in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not errors, errors
    assert registry.open_homes() == []
    with SessionDB(coder / "state.db", rebuild_fts=False) as db:
        assert len(db.get_messages("s1")) == rounds * workers


# ---------------------------------------------------------------------------------------------
# Profiles that cannot be resolved
# ---------------------------------------------------------------------------------------------


def test_a_vanished_profile_directory_fails_before_anything_is_created(
    registry: ProfileStoreRegistry[SessionDB], root: Path
) -> None:
    gone = root / "profiles" / "gone"
    gone.mkdir(parents=True)
    gone.rmdir()
    before = tree(root)

    with pytest.raises(ProfileNotFoundError) as caught:
        registry.acquire("gone", owner=Owner("o"))
    assert caught.value.profile == "gone" and caught.value.path == gone
    with pytest.raises(ProfileNotFoundError):
        registry.acquire(home=gone, owner=Owner("o"))
    with pytest.raises(ProfileNotFoundError):
        with registry.holding("gone", owner=Owner("o")):
            pytest.fail("the block must not run")

    assert not gone.exists()
    assert tree(root) == before
    assert registry.open_homes() == []


@pytest.mark.parametrize("name", ["", "..", "../escape", "a/b", "/abs", ".hidden", "x" * 65])
def test_an_invalid_profile_name_fails_before_anything_is_created(
    registry: ProfileStoreRegistry[SessionDB], root: Path, name: str
) -> None:
    before = tree(root)
    with pytest.raises(UnsafePathError):
        registry.acquire(name, owner=Owner("o"))
    assert tree(root) == before
    assert registry.open_homes() == []


def test_a_profile_symlinked_out_of_the_root_is_refused(
    registry: ProfileStoreRegistry[SessionDB], root: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (root / "profiles").mkdir()
    (root / "profiles" / "sneaky").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError):
        registry.acquire("sneaky", owner=Owner("o"))
    assert list(outside.iterdir()) == []


# ---------------------------------------------------------------------------------------------
# Work done for a profile uses that profile's home
# ---------------------------------------------------------------------------------------------

CHILD = textwrap.dedent(
    """
    from hermes_state import SessionDB, get_hermes_home
    print(get_hermes_home())
    with SessionDB() as db:
        db.create_session("from-child", "cron")
    """
)


def test_a_profile_acquired_inside_another_profiles_override_is_its_sibling_and_so_is_its_child(
    registry: ProfileStoreRegistry[SessionDB], root: Path, coder: Path, writer: Path
) -> None:
    with hermes_home_override(coder):
        db = registry.acquire("writer", owner=Owner("o"))
        assert db.profile_home == writer
        assert profile_config_path(db.profile_home) == writer / "config.yaml"
        env = child_process_env(home=db.profile_home)
        assert env["HERMES_HOME"] == str(writer)
        done = subprocess.run(
            [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
            timeout=30, cwd=Path(__file__).resolve().parent.parent,
        )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(writer)
    assert session_ids(writer / "state.db") == {"from-child"}
    assert not (coder / "state.db").exists()
    assert not (root / "state.db").exists()


def test_holding_binds_the_context_to_the_profile_home_for_the_block(
    registry: ProfileStoreRegistry[SessionDB], coder: Path, writer: Path
) -> None:
    with hermes_home_override(coder):
        with registry.holding("writer", owner=Owner("assembler")) as db:
            assert get_hermes_home() == writer
            assert child_process_env()["HERMES_HOME"] == str(writer)
            db.create_session("s1", "cli")
        assert get_hermes_home() == coder
    assert db.closed, "the block's hold was the only one"
    assert session_ids(writer / "state.db") == {"s1"}


def test_a_corrupt_profile_store_spools_into_its_own_home_whatever_the_context(
    coder: Path, writer: Path, damage_messages_table: Callable[[Path], None]
) -> None:
    with SessionDB(writer / "state.db", rebuild_fts=False) as db:
        db.create_session("s1", "cli")
        db.append_message("s1", "user", "before the damage")
    damage_messages_table(writer / "state.db")

    with hermes_home_override(coder):
        with SessionDB(writer / "state.db", rebuild_fts=False) as db:
            assert db.profile_home == writer
            with pytest.raises(StateDbCorruptError) as caught:
                db.append_message("s1", "user", "kept on disk")
    assert caught.value.spooled_to == writer / "sessions" / "s1.jsonl"
    assert "kept on disk" in caught.value.spooled_to.read_text()
    assert not (coder / "sessions").exists()


def test_a_scratch_database_belongs_to_the_home_of_the_context_that_opened_it(
    coder: Path, tmp_path: Path
) -> None:
    with hermes_home_override(coder), SessionDB(tmp_path / "scratch.db") as db:
        assert db.profile_home == coder
