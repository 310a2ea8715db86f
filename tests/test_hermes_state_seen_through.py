"""Compaction and replacement beside concurrent appends: ``seen_through_id``, the bound of what
the caller saw, given explicitly or remembered by the handle from its reads and writes."""

from __future__ import annotations

import random
import subprocess
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import hermes_state_seen
from conftest import rest_of_output
from state_helpers import raw
from hermes_state import InvalidInputError, RewriteRefusedError, SessionDB
from hermes_state_gateway import OWNER_MARKER_KEY
from hermes_state_seen import SeenThrough

OPS = ("archive_and_compact", "replace_messages")


def rewrite(db: SessionDB, op: str, session_id: str, messages: list[dict[str, Any]],
            **bound: Any) -> Any:
    return getattr(db, op)(session_id, messages, **bound)


def uids(rows: list[dict[str, Any]]) -> list[str]:
    return [r["message_uid"] for r in rows]


def summary(text: str = "summary") -> dict[str, Any]:
    return {"role": "user", "content": text, "message_uid": uuid.uuid4().hex}


def seed_session(db: SessionDB, session_id: str = "s", rows: int = 4) -> list[dict[str, Any]]:
    db.create_session(session_id, "cli")
    db.append_message(session_id, "system", "You are helpful.", timestamp=1.0)
    for i in range(1, rows):
        db.append_message(session_id, "user", f"question {i}", timestamp=1.0 + i)
    return db.get_messages(session_id)


def append_elsewhere(path: Path, session_id: str, *contents: str) -> list[dict[str, Any]]:
    """Rows another handle appends (one the caller's handle never reads through)."""
    with SessionDB(path, rebuild_fts=False) as other:
        for n, content in enumerate(contents):
            if n % 2:
                other.append_message(
                    session_id, "assistant", content, timestamp=50.0 + n,
                    tool_calls=[{"id": f"call_{n}", "function": {"name": "terminal"}}],
                    display_metadata={"n": n}, platform_message_id=f"p{n}",
                )
            else:
                other.append_message(session_id, "user", content, timestamp=50.0 + n,
                                     observed=True, effect_disposition="kept")
        return [m for m in other.get_messages(session_id) if m["content"] in contents]


def assert_counters_match_live_rows(db: SessionDB, session_id: str) -> None:
    live = db.get_messages(session_id)
    calls = sum(len(m["tool_calls"] or []) for m in live if m["role"] == "assistant")
    session = db.get_session(session_id)
    assert (session["message_count"], session["tool_call_count"]) == (len(live), calls)


def without_id(row: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k != "id"}


# ---------------------------------------------------------------------------------------------
# An explicit bound
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", OPS)
def test_rows_above_the_bound_stay_live_after_the_new_generation(
    db: SessionDB, db_path: Path, op: str
) -> None:
    read = seed_session(db)
    later = append_elsewhere(db_path, "s", "late user turn", "late assistant turn")
    generation = [read[0], summary()]

    rewrite(db, op, "s", generation, seen_through_id=read[-1]["id"])

    live = db.get_messages("s")
    assert uids(live) == uids(generation) + uids(later)
    assert [without_id(m) for m in live[2:]] == [without_id(m) for m in later], \
        "every column of an unseen row is kept; only its id changes"
    assert all(m["id"] > max(r["id"] for r in live[:2]) for m in live[2:])
    assert uids(db.get_messages_as_conversation("s")) == uids(live)
    assert [t["content"] for t in db.get_messages_as_conversation("s")][2:] == [
        "late user turn", "late assistant turn"]
    assert_counters_match_live_rows(db, "s")
    assert db.get_session("s")["tool_call_count"] == 1


def test_the_compaction_archive_is_marked_compacted(db: SessionDB, db_path: Path) -> None:
    read = seed_session(db)
    later = append_elsewhere(db_path, "s", "late")
    db.archive_and_compact("s", [summary()], seen_through_id=read[-1]["id"])

    every = db.get_messages("s", include_inactive=True)
    archived = [m for m in every if not m["active"]]
    assert uids(archived) == uids(read)
    assert all(m["compacted"] for m in archived)
    assert not any(m["compacted"] for m in every if m["active"])
    assert uids(db.get_messages("s"))[1:] == uids(later)
    assert len(every) == len(read) + 2, "the unseen row moved: it exists once"


@pytest.mark.parametrize("op", OPS)
def test_a_bound_beyond_the_newest_row_covers_the_whole_session(db: SessionDB, op: str) -> None:
    read = seed_session(db)
    rewrite(db, op, "s", [summary()], seen_through_id=read[-1]["id"] + 10**6)
    assert [m["content"] for m in db.get_messages("s")] == ["summary"]
    rewrite(db, op, "s", [summary("again")], seen_through_id=2**63 - 1)
    assert [m["content"] for m in db.get_messages("s")] == ["again"]
    assert_counters_match_live_rows(db, "s")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("beyond", [2**63, 2**64, -(2**63) - 1, 2**70])
def test_a_bound_no_row_id_can_reach_is_refused_not_clamped(
    db: SessionDB, op: str, beyond: int
) -> None:
    read = seed_session(db)
    with pytest.raises(InvalidInputError, match="64-bit range"):
        rewrite(db, op, "s", [summary()], seen_through_id=beyond)
    assert db.get_messages("s", include_inactive=True) == read, "nothing was written"


@pytest.mark.parametrize("op", OPS)
def test_a_bound_below_every_row_keeps_them_all_after_the_generation(
    db: SessionDB, op: str
) -> None:
    read = seed_session(db)
    rewrite(db, op, "s", [summary()], seen_through_id=0)
    assert [m["content"] for m in db.get_messages("s")] == ["summary"] + [
        m["content"] for m in read]
    assert_counters_match_live_rows(db, "s")


@pytest.mark.parametrize("op", OPS)
def test_rows_the_caller_includes_by_uid_count_as_seen(
    db: SessionDB, db_path: Path, op: str
) -> None:
    read = seed_session(db, rows=6)
    bound = read[2]["id"]
    included = read[4]
    generation = [read[0], summary(), included]

    rewrite(db, op, "s", generation, seen_through_id=bound)

    live = db.get_messages("s")
    assert uids(live) == uids(generation) + [read[3]["message_uid"], read[5]["message_uid"]]
    assert uids(live).count(included["message_uid"]) == 1, "no live duplicate"
    assert_counters_match_live_rows(db, "s")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", ["7", 7.0, True, [7], object()],
                         ids=["str", "float", "bool", "list", "object"])
def test_a_bound_that_is_not_an_int_is_refused(db: SessionDB, op: str, bad: Any) -> None:
    seed_session(db)
    before = db.get_messages("s", include_inactive=True)
    with pytest.raises(InvalidInputError) as refused:
        rewrite(db, op, "s", [summary()], seen_through_id=bad)
    assert isinstance(refused.value, ValueError)
    assert "seen_through_id" in str(refused.value)
    assert db.get_messages("s", include_inactive=True) == before


@pytest.mark.parametrize("with_archived", [False, True])
def test_a_replacement_keeps_unseen_rows_live_after_the_rows_given(
    db: SessionDB, db_path: Path, with_archived: bool
) -> None:
    """Rows given with ``active=False`` join the archive; the unseen rows stay live after the
    new active rows either way."""
    read = seed_session(db)
    later = append_elsewhere(db_path, "s", "late")
    given = [{**read[1], "active": False, "compacted": True}] if with_archived else []
    assert db.replace_messages("s", [*given, summary()], seen_through_id=read[-1]["id"]) is None

    live = db.get_messages("s")
    assert [m["content"] for m in live] == ["summary", "late"]
    assert live[-1]["message_uid"] == later[0]["message_uid"]
    archived = [m for m in db.get_messages("s", include_inactive=True) if not m["active"]]
    assert [(m["content"], m["compacted"]) for m in archived] == (
        [("question 1", True)] if with_archived else [])
    assert_counters_match_live_rows(db, "s")


@pytest.mark.parametrize("op", OPS)
def test_a_moved_row_is_searched_under_its_new_id(db: SessionDB, db_path: Path, op: str) -> None:
    read = seed_session(db)
    append_elsewhere(db_path, "s", "zebra crossing at noon, 東京で会議")
    rewrite(db, op, "s", [summary()], seen_through_id=read[-1]["id"])

    moved = db.get_messages("s")[-1]
    for query in ("zebra", "東京", "会"):  # the word, the CJK and the trigram indexes
        assert [h["id"] for h in db.search_messages(query)] == [moved["id"]], query
    assert [h["id"] for h in db.search_messages("zebra", include_inactive=True)] == [moved["id"]]
    assert all(v is None for v in db.check_fts_integrity().values())


def test_the_readers_of_the_archive_flags_still_agree(db: SessionDB, db_path: Path) -> None:
    """Search covers the whole record: the archived row summarized away is found once, beside
    the live ones; export and import keep the flags; the exception path still finds an input
    owned by an archived row."""
    db.create_session("s", "telegram")
    marker = SessionDB.ingress_owner_marker("telegram", "p", "dm", 1, None, 7)
    owner = db.append_message("s", "user", "quokka question",
                              display_metadata={OWNER_MARKER_KEY: marker})
    read = db.get_messages("s")
    late = append_elsewhere(db_path, "s", "quokka follow-up")
    db.archive_and_compact("s", [summary("quokka summary")], seen_through_id=read[-1]["id"])

    live = [m["id"] for m in db.get_messages("s")]
    assert {h["id"] for h in db.search_messages("quokka")} == {owner, *live}
    assert {h["id"] for h in db.search_messages("quokka", include_inactive=True)} == {
        owner, *live}
    owned = db.find_owned_input("s", marker)
    assert (owned["id"], owned["active"]) == (owner, False)
    assert db.persist_exception_input("s", "again", marker=marker) == ("existing", owner)

    exported = db.export_session("s")
    with SessionDB(db_path.with_name("copy.db"), rebuild_fts=False) as copy:
        assert copy.import_sessions([exported])["imported_ids"] == ["s"]

        def flags(store: SessionDB) -> list[tuple[Any, ...]]:
            return [(m["message_uid"], m["active"], m["compacted"])
                    for m in store.get_messages("s", include_inactive=True)]

        assert flags(copy) == flags(db)
    assert flags(db) == [(owner_uid, False, True) for owner_uid in uids(read)] + [
        (db.get_messages("s")[0]["message_uid"], True, False),
        (late[0]["message_uid"], True, False),
    ]


# ---------------------------------------------------------------------------------------------
# The remembered bound
# ---------------------------------------------------------------------------------------------

READS: dict[str, Callable[[SessionDB, str], Any]] = {
    "get_messages": lambda db, s: db.get_messages(s),
    "page": lambda db, s: db.get_messages(s, limit=2, offset=2),
    "conversation": lambda db, s: db.get_messages_as_conversation(s),
    "with_ancestors": lambda db, s: db.get_messages_as_conversation(s, include_ancestors=True),
    "export_session": lambda db, s: db.export_session(s),
    "export_lineage": lambda db, s: db.export_session_lineage(s),
}


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("read", list(READS))
def test_a_handle_remembers_what_it_read(
    db: SessionDB, db_path: Path, op: str, read: str
) -> None:
    seed_session(db)
    with SessionDB(db_path, rebuild_fts=False) as fresh:  # has neither read nor written "s"
        READS[read](fresh, "s")
        later = append_elsewhere(db_path, "s", "late user turn", "late assistant turn")
        rewrite(fresh, op, "s", [summary()])

    live = db.get_messages("s")
    assert [m["content"] for m in live] == ["summary", "late user turn", "late assistant turn"]
    assert uids(live)[1:] == uids(later)
    assert_counters_match_live_rows(db, "s")


@pytest.mark.parametrize("op", OPS)
def test_a_handle_that_never_read_the_session_keeps_what_its_messages_do_not_account_for(
    db: SessionDB, db_path: Path, op: str
) -> None:
    """A restart between the read and the rewrite: the new handle knows no bound. The rows
    after the newest one its messages carry again (by uid) stay live after them."""
    read = seed_session(db)  # the read, by the process that restarts
    later = append_elsewhere(db_path, "s", "late user turn", "late assistant turn")
    with SessionDB(db_path, rebuild_fts=False) as restarted:
        rewrite(restarted, op, "s", [read[0], summary(), read[-1]])
    live = db.get_messages("s")
    assert [m["content"] for m in live] == [
        "You are helpful.", "summary", "question 3", "late user turn", "late assistant turn"]
    assert uids(live)[3:] == uids(later)
    assert_counters_match_live_rows(db, "s")


@pytest.mark.parametrize("op", OPS)
def test_a_handle_that_never_read_the_session_and_accounts_for_none_of_it_is_refused(
    db: SessionDB, db_path: Path, op: str
) -> None:
    seed_session(db)
    append_elsewhere(db_path, "s", "late")
    before = db.get_messages("s", include_inactive=True)
    with SessionDB(db_path, rebuild_fts=False) as fresh:
        with pytest.raises(RewriteRefusedError, match="has not read session 's'") as refused:
            rewrite(fresh, op, "s", [summary()])
        assert refused.value.session_id == "s"
        assert fresh.get_messages("s", include_inactive=True) == before, "nothing was written"
        fresh.get_messages("s")  # read, then rewrite: it vouches for what it read
        rewrite(fresh, op, "s", [summary()])
    assert [m["content"] for m in db.get_messages("s")] == ["summary"]


@pytest.mark.parametrize("op", OPS)
def test_a_handle_that_never_read_an_empty_session_may_write_it(
    db: SessionDB, db_path: Path, op: str
) -> None:
    db.create_session("s", "cli")
    with SessionDB(db_path, rebuild_fts=False) as fresh:
        rewrite(fresh, op, "s", [summary()])
    assert [m["content"] for m in db.get_messages("s")] == ["summary"]


@pytest.mark.parametrize("op", OPS)
def test_an_empty_read_remembers_that_nothing_was_seen(
    db: SessionDB, db_path: Path, op: str
) -> None:
    db.create_session("s", "cli")
    with SessionDB(db_path, rebuild_fts=False) as fresh:
        assert fresh.get_messages("s") == []
        later = append_elsewhere(db_path, "s", "arrived after the read")
        rewrite(fresh, op, "s", [summary()])
    assert [m["content"] for m in db.get_messages("s")] == ["summary", later[0]["content"]]


@pytest.mark.parametrize("op", OPS)
def test_own_appends_advance_the_remembered_bound(db: SessionDB, op: str) -> None:
    seed_session(db)
    db.append_message("s", "assistant", "my own answer")
    rewrite(db, op, "s", [summary()])
    assert [m["content"] for m in db.get_messages("s")] == ["summary"], \
        "what this handle wrote itself, right after what it read, counts as seen"


@pytest.mark.parametrize("op", OPS)
def test_own_appends_after_an_unseen_row_do_not_cover_it(
    db: SessionDB, db_path: Path, op: str
) -> None:
    seed_session(db)
    later = append_elsewhere(db_path, "s", "someone else's turn")
    mine = {"role": "assistant", "content": "my answer", "message_uid": uuid.uuid4().hex}
    db.append_message("s", **mine)
    rewrite(db, op, "s", [summary(), mine])

    assert [m["content"] for m in db.get_messages("s")] == [
        "summary", "my answer", "someone else's turn"]
    assert db.get_messages("s")[-1]["message_uid"] == later[0]["message_uid"]


@pytest.mark.parametrize("op", OPS)
def test_the_rewrite_itself_moves_the_remembered_bound(
    db: SessionDB, db_path: Path, op: str
) -> None:
    read = seed_session(db)
    append_elsewhere(db_path, "s", "first late turn")
    rewrite(db, op, "s", [summary("one")], seen_through_id=read[-1]["id"])
    append_elsewhere(db_path, "s", "second late turn")
    rewrite(db, op, "s", [summary("two")])
    assert [m["content"] for m in db.get_messages("s")] == [
        "two", "first late turn", "second late turn"], \
        "the handle wrote generation one, never read the rows moved after it"


@pytest.mark.parametrize("op", OPS)
def test_an_evicted_session_keeps_what_it_never_saw(db_path: Path, op: str) -> None:
    with SessionDB(db_path, rebuild_fts=False, seen_sessions=2) as db:
        reads = {}
        for sid in ("a", "b", "c"):
            seed_session(db, sid)
            reads[sid] = db.get_messages(sid)
        append_elsewhere(db_path, "a", "late a")
        append_elsewhere(db_path, "c", "late c")
        rewrite(db, op, "a", [summary(), reads["a"][-1]])  # "a" was evicted by "c"
        rewrite(db, op, "c", [summary(), reads["c"][-1]])
        assert [m["content"] for m in db.get_messages("a")] == [
            "summary", "question 3", "late a"], "no bound known: the late row stays"
        assert [m["content"] for m in db.get_messages("c")] == ["summary", "question 3", "late c"]
        with pytest.raises(RewriteRefusedError):
            rewrite(db, op, "b", [summary()])  # evicted, and its messages carry none of it


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "8"])
def test_the_memory_size_must_be_a_positive_int(db_path: Path, bad: Any) -> None:
    with pytest.raises(InvalidInputError, match="positive int"):
        SessionDB(db_path, rebuild_fts=False, seen_sessions=bad)


def test_seen_through_is_thread_safe_and_bounded() -> None:
    seen = SeenThrough(capacity=50)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        rng = random.Random(n)
        try:
            for i in range(2000):
                sid = f"s{rng.randrange(80)}"
                seen.saw(sid, i)
                seen.wrote(sid, i + 1, rng.choice([None, i, i + 5]))
                assert isinstance(seen.bound(sid), (int, type(None)))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(seen) <= 50

    seen.saw("x", 10)
    seen.wrote("x", 12, 10)
    assert seen.bound("x") == 12, "the row before this handle's own write was seen"
    seen.wrote("x", 15, 13)
    assert seen.bound("x") == 12, "row 13 was not"
    seen.saw("x", 9)
    assert seen.bound("x") == 12, "an older read does not lower the bound"
    seen.wrote("new", 7, 3)
    assert seen.bound("new") == 7, "a first write vouches for what lies before it"


# ---------------------------------------------------------------------------------------------
# A real concurrent appender
# ---------------------------------------------------------------------------------------------

# Appends to session argv[2] of store argv[1] until file argv[4] exists, a few ms apart
# (seeded by argv[3]); prints "<row id> <uid> <timestamp>" once each append is acknowledged.
# Every fourth row is an assistant turn making a tool call, so counters have calls to count.
APPENDER = textwrap.dedent(
    """
    import os, random, sys, time, uuid
    from hermes_state import SessionDB

    path, session_id, seed, stop = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rng = random.Random(seed)
    with SessionDB(path, rebuild_fts=False) as db:
        n = 0
        while not os.path.exists(stop):
            uid, stamp = uuid.uuid4().hex, time.time()
            if n % 4 == 3:
                call = {"id": f"call_{n}", "type": "function",
                        "function": {"name": "terminal", "arguments": "{}"}}
                row = db.append_message(session_id, "assistant", f"turn {n}", tool_calls=[call],
                                        message_uid=uid, timestamp=stamp)
            else:
                row = db.append_message(session_id, "user", f"turn {n}", message_uid=uid,
                                        timestamp=stamp)
            print(row, uid, repr(stamp), flush=True)
            n += 1
            time.sleep(rng.uniform(0, 0.004))
    """
)
ROUNDS = 40


class Acks:
    """The appender's acknowledgements, read as they arrive."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.rows: list[tuple[int, str, float]] = []

    def _take(self, line: str) -> None:
        row, uid, stamp = line.split()
        self.rows.append((int(row), uid, float(stamp)))

    def _read_until(self, done: Callable[[], bool]) -> None:
        assert self.proc.stdout is not None
        while not done():
            line = self.proc.stdout.readline()
            assert line, f"the appender stopped: {self.proc.stderr and self.proc.stderr.read()}"
            self._take(line)

    def wait_beyond(self, newest: int) -> None:
        """Block until a row with an id above ``newest`` has been acknowledged."""
        self._read_until(lambda: bool(self.rows) and self.rows[-1][0] > newest)

    def finish(self, stop: Path, at_least: int = 0) -> None:
        """Stop the appender once ``at_least`` rows are acknowledged (a loaded machine slows
        it, not the rounds), and take the rest of its acknowledgements."""
        self._read_until(lambda: len(self.rows) >= at_least)
        stop.touch()
        out, err = rest_of_output(self.proc)
        assert self.proc.returncode == 0, err
        for line in out.splitlines():
            self._take(line)


@pytest.fixture
def appender(
    db: SessionDB, tmp_path: Path, spawn_python: Callable[..., subprocess.Popen[str]]
) -> Iterator[Callable[[int], Acks]]:
    stop = tmp_path / "stop"
    started: list[Acks] = []

    def start(seed: int) -> Acks:
        acks = Acks(spawn_python(APPENDER, str(db.path), "s", str(seed), str(stop)))
        started.append(acks)
        return acks

    yield start
    for acks in started:
        if acks.proc.poll() is None:
            stop.touch()
            acks.proc.kill()
            acks.proc.communicate()


COMPACTOR_READS = ("rows", "conversation", "conversation_ids")


def read_session(
    db: SessionDB, how: str, explicit: bool
) -> tuple[list[dict[str, Any]], int | None]:
    """The compactor's read, by one of the reads callers use; (rows, newest id if known)."""
    if how == "rows":
        rows = db.get_messages("s")
        return rows, max(r["id"] for r in rows)
    if how == "conversation" and not explicit:
        return db.get_messages_as_conversation("s"), None
    turns = db.get_messages_as_conversation("s", include_row_ids=True)
    return turns, max(t["_row_id"] for t in turns)


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("bound", ["explicit", "remembered"])
@pytest.mark.parametrize("op", OPS)
def test_no_acknowledged_append_is_lost_to_a_concurrent_rewrite(
    db: SessionDB, appender: Callable[[int], Acks], tmp_path: Path, op: str, bound: str,
    seed: int,
) -> None:
    """A compactor loops read → summarise → rewrite while another process appends. Each read
    must show the generation the previous rewrite wrote, then exactly the acknowledged rows
    appended since the previous read, in append order; so every acknowledged row it never saw
    survives, after the generation written after it. Every other round the compactor waits,
    between its read and its rewrite, until an append it cannot have seen is acknowledged (the
    others pause at random); some rounds it writes a turn of its own first, after that row."""
    rng = random.Random(seed)
    # Drawn apart from ``rng``, whose later draws depend on how many rows each read saw: the
    # rounds that force a race are fixed by the seed, not by the machine's speed.
    reads = random.Random(seed).choices(COMPACTOR_READS, k=ROUNDS)
    explicit = bound == "explicit"
    db.create_session("s", "cli")
    db.append_message("s", "system", "You are helpful.", message_uid=uuid.uuid4().hex)
    previous = uids(db.get_messages("s"))  # what the next read must start with
    chunks: list[list[str]] = []  # the rows each read shows beyond it
    acks = appender(seed)
    raced = 0
    for n in range(ROUNDS):
        live, newest = read_session(db, reads[n], explicit)
        assert uids(live)[: len(previous)] == previous, f"round {n}: the generation moved"
        chunks.append(uids(live)[len(previous):])
        if newest is not None and n % 2 == 0:
            acks.wait_beyond(newest)
            raced += 1
        else:
            time.sleep(rng.uniform(0, 0.01))
        own = []
        if rng.random() < 0.3:
            own = [{"role": "assistant", "content": f"own {n}", "message_uid": uuid.uuid4().hex}]
            db.append_message("s", **own[0])
        retained = [t for t in live[1:] if rng.random() < 0.25]
        generation = [live[0], summary(f"summary {n}"), *retained, *own]
        kwargs = {"seen_through_id": newest} if explicit else {}
        rewrite(db, op, "s", generation, **kwargs)
        previous = uids(generation)
    acks.finish(tmp_path / "stop", at_least=ROUNDS)

    final = db.get_messages("s")
    assert uids(final)[: len(previous)] == previous
    chunks.append(uids(final)[len(previous):])
    acknowledged = [uid for _, uid, _ in acks.rows]
    assert [uid for chunk in chunks for uid in chunk] == acknowledged, \
        "each acknowledged row shows up once, in append order, after the generation"
    assert raced >= ROUNDS // 4 and len(acknowledged) >= ROUNDS

    stamps = {uid: stamp for _, uid, stamp in acks.rows}
    for row in final[len(previous):]:
        assert row["timestamp"] == stamps[row["message_uid"]]
    assert uids(db.get_messages_as_conversation("s")) == uids(final)
    assert_counters_match_live_rows(db, "s")
    if op == "archive_and_compact":
        every = db.get_messages("s", include_inactive=True)
        assert set(acknowledged) <= set(uids(every)), "compaction archives, never deletes"
        assert all(m["compacted"] for m in every if not m["active"])


def test_a_seen_hook_must_run_what_takes_the_parameters_of_what_it_stands_for() -> None:
    import hermes_state_compression as compression
    import hermes_state_messages as messages

    with pytest.raises(TypeError, match="must take the parameters of get_messages"):
        hermes_state_seen.Seen(like=messages.get_messages, run=compression.archive_generation)


def test_a_seen_hook_called_without_a_handle_is_the_function_it_stands_for(
    db: SessionDB,
) -> None:
    seed_session(db, "s", rows=3)
    with raw(db.db_path) as conn:
        rows = hermes_state_seen.GET_MESSAGES(conn, "s")
        conversation = hermes_state_seen.GET_CONVERSATION(conn, "s")
    assert rows == db.get_messages("s")
    assert conversation == db.get_messages_as_conversation("s")
