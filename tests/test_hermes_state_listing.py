"""Listing and counting as the previous store's callers use them: the pickers' pages, their
filters and two orders, the tip projection, the dashboard's lookups and the resume target."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_state import InvalidInputError, SessionDB, TitleConflictError

DELEGATE = json.dumps({"_delegate_from": "x"})
BRANCH = json.dumps({"_branched_from": "x"})


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [r["id"] for r in rows]


def make(db: SessionDB, session_id: str, started_at: float, *, messages: int = 0,
         last: float | None = None, **columns: Any) -> None:
    """A session started at ``started_at`` with ``messages`` user turns, the last at
    ``last`` (each a second apart before it)."""
    db.create_session(session_id, columns.pop("source", "cli"), started_at=started_at,
                      **columns)
    end = last if last is not None else started_at + messages
    for i in range(messages):
        db.append_message(session_id, "user", f"{session_id} turn {i}",
                          timestamp=end - (messages - 1 - i))


def compressed(db: SessionDB, root: str, *segments: str, start: float = 100.0) -> None:
    """A conversation compressed into ``root`` and ``segments``, one message each."""
    chain = [root, *segments]
    for n, sid in enumerate(chain):
        parent = chain[n - 1] if n else None
        last = n == len(chain) - 1
        make(db, sid, start + 10 * n, messages=1, parent_session_id=parent,
             **({} if last else {"ended_at": start + 10 * n + 5, "end_reason": "compression"}))


# --- listable rows (the picker's rule) --------------------------------------------------------


def test_pickers_list_roots_and_branches_never_continuations_delegates_or_tool_runs(
    db: SessionDB,
) -> None:
    compressed(db, "root", "cont")
    make(db, "marked-branch", 200.0, parent_session_id="root", model_config=BRANCH)
    make(db, "forked", 300.0, ended_at=310.0, end_reason="branched")
    make(db, "after-fork", 320.0, parent_session_id="forked")
    make(db, "before-fork", 305.0, parent_session_id="forked")  # started before the end
    make(db, "delegate", 330.0, parent_session_id="forked", model_config=DELEGATE)
    make(db, "orphan-delegate", 340.0, model_config=json.dumps({"_delegate_from": "__orphaned__"}))
    make(db, "tool-run", 350.0, parent_session_id="after-fork", source="tool")
    make(db, "bad-config", 360.0, model_config="not json")

    listed = ids(db.list_sessions_rich(limit=50))
    assert listed == ["bad-config", "after-fork", "forked", "marked-branch", "cont"]
    assert db.list_sessions_rich(limit=50)[-1]["_lineage_root_id"] == "root"
    assert db.session_count(exclude_children=True) == 5
    everything = ids(db.list_sessions_rich(limit=50, include_children=True))
    assert len(everything) == db.session_count() == 10
    assert "_lineage_root_id" not in str(db.list_sessions_rich(limit=50, include_children=True))


# --- filters ---------------------------------------------------------------------------------


def test_cwd_prefix_matches_the_directory_and_below_with_either_separator(db: SessionDB) -> None:
    for n, cwd in enumerate(["/src/app", "/src/app/api", "/src/app-web", "/src/apple",
                             "C:\\src\\app\\ui", "C:\\src\\app", None, "/SRC/APP"]):
        make(db, f"s{n}", float(n), cwd=cwd)
    listed = ids(db.list_sessions_rich(cwd_prefix="/src/app/", limit=50))
    assert listed == ["s1", "s0"]  # not app-web, not apple, not another case
    assert ids(db.list_sessions_rich(cwd_prefix="C:\\src\\app\\\\", limit=50)) == ["s5", "s4"]
    assert db.session_count(cwd_prefix="/src/app") == 2
    assert db.session_count(cwd_prefix="/") == 5  # only separators: kept, everything below /
    assert db.session_count(cwd_prefix="/src/app%") == 0  # LIKE wildcards are literal
    assert db.session_count(cwd_prefix="") == 8  # empty: no filter


def test_min_message_count_is_tested_on_the_root_before_projection(db: SessionDB) -> None:
    make(db, "root", 100.0, messages=1, ended_at=105.0, end_reason="compression")
    make(db, "long-tip", 110.0, messages=9, parent_session_id="root")
    make(db, "busy", 50.0, messages=3)
    assert ids(db.list_sessions_rich(min_message_count=2)) == ["busy"]
    assert ids(db.list_sessions_rich(min_message_count=1)) == ["long-tip", "busy"]
    assert db.session_count(min_message_count=2) == 2  # rows: long-tip and busy
    assert db.session_count(min_message_count=2, exclude_children=True) == 1


def test_archived_only_overrides_include_archived(db: SessionDB) -> None:
    make(db, "live", 1.0)
    make(db, "shelved", 2.0, archived=1)
    assert ids(db.list_sessions_rich()) == ["live"]
    assert ids(db.list_sessions_rich(include_archived=True)) == ["shelved", "live"]
    assert ids(db.list_sessions_rich(archived_only=True)) == ["shelved"]
    assert ids(db.list_sessions_rich(archived_only=True, include_archived=False)) == ["shelved"]
    assert (db.session_count(), db.session_count(archived_only=True),
            db.session_count(include_archived=True)) == (1, 1, 2)


def test_source_and_excluded_sources_combine_with_the_other_filters(db: SessionDB) -> None:
    make(db, "a", 1.0, source="cli", cwd="/w")
    make(db, "b", 2.0, source="cron", cwd="/w")
    make(db, "c", 3.0, source="telegram", cwd="/elsewhere")
    assert ids(db.list_sessions_rich(exclude_sources=["cron"], cwd_prefix="/w")) == ["a"]
    assert db.session_count(exclude_sources=["cron"], exclude_children=True) == 2
    assert db.session_count("cron") == 1


# --- the activity order ----------------------------------------------------------------------


def test_order_by_last_active_ranks_by_the_newest_activity_over_the_chain(db: SessionDB) -> None:
    compressed(db, "old-root", "old-tip", start=10.0)
    db.append_message("old-tip", "user", "back again", timestamp=1000.0)
    make(db, "new", 500.0, messages=1)
    make(db, "tie-a", 400.0, messages=0)
    make(db, "tie-b", 400.0, messages=0)
    make(db, "earlier-start", 300.0, last=400.0, messages=1)
    rows = db.list_sessions_rich(order_by_last_active=True, limit=50)
    assert ids(rows) == ["old-tip", "new", "tie-b", "tie-a", "earlier-start"]
    assert rows[0]["last_active"] == 1000.0 and rows[0]["_lineage_root_id"] == "old-root"
    assert ids(db.list_sessions_rich(limit=50)) == ["new", "tie-b", "tie-a", "earlier-start",
                                                    "old-tip"]
    page = db.list_sessions_rich(order_by_last_active=True, limit=2, offset=1)
    assert ids(page) == ["new", "tie-b"]


def test_search_and_id_queries_match_the_chain_and_only_in_the_activity_order(
    db: SessionDB,
) -> None:
    compressed(db, "root-1", "cont-1x")
    db.set_session_title("cont-1x", "AN-94 rifle")
    make(db, "other", 500.0, title="Deploy 50%_off")

    def search(**kw: Any) -> list[str]:
        return ids(db.list_sessions_rich(order_by_last_active=True, **kw))

    assert search(search_query="an94") == ["cont-1x"]  # punctuation-free form
    assert search(search_query="an-94") == ["cont-1x"]
    assert search(search_query="RIFLE") == ["cont-1x"]  # case-insensitive
    assert search(search_query="root-1") == ["cont-1x"]  # an id in the chain
    assert search(id_query="CONT-1") == ["cont-1x"]
    assert search(id_query="rifle") == []  # ids only
    assert search(search_query="50%_") == ["other"]
    assert search(search_query="0%x") == []  # wildcards are literal
    assert search(search_query="   ") == ["other", "cont-1x"]  # blank: no filter
    assert search(search_query="an94", id_query="other") == []  # both must match
    assert ids(db.list_sessions_rich(search_query="an94")) == ["other", "cont-1x"]  # ignored
    assert ids(db.list_sessions_rich(id_query="nothing")) == ["other", "cont-1x"]


# --- the tip projection ----------------------------------------------------------------------


def test_a_compressed_row_takes_the_tips_fields_and_keeps_the_roots_others(
    db: SessionDB,
) -> None:
    make(db, "root", 100.0, messages=2, title="Named", model="m-root", system_prompt="root sp",
         cwd="/root", git_branch="main", ended_at=150.0, end_reason="compression",
         input_tokens=70, archived=0)
    make(db, "tip", 200.0, messages=0, parent_session_id="root", model=None)
    [row] = db.list_sessions_rich()
    assert row["id"] == "tip" and row["_lineage_root_id"] == "root"
    # From the tip, NULLs included.
    assert (row["title"], row["model"], row["system_prompt"], row["cwd"],
            row["git_branch"]) == (None, None, None, None, None)
    assert (row["ended_at"], row["end_reason"], row["message_count"], row["preview"],
            row["last_active"]) == (None, None, 0, "", 200.0)
    # From the root.
    assert (row["started_at"], row["source"], row["input_tokens"]) == (100.0, "cli", 70)

    [raw] = db.list_sessions_rich(project_compression_tips=False)
    assert raw["id"] == "root" and "_lineage_root_id" not in raw
    assert raw["preview"] == "root turn 0"
    [compact] = db.list_sessions_rich(compact_rows=True)
    assert "system_prompt" not in compact and compact["id"] == "tip"
    assert "system_prompt" in db.list_sessions_rich()[0]


def test_a_row_whose_continuation_is_gone_is_listed_as_itself(db: SessionDB) -> None:
    make(db, "ended", 1.0, messages=1, ended_at=2.0, end_reason="compression")
    [row] = db.list_sessions_rich()
    assert row["id"] == "ended" and "_lineage_root_id" not in row


def test_the_enriched_row_has_every_column_preview_and_last_active(db: SessionDB) -> None:
    make(db, "s", 10.0)
    db.append_message("s", "assistant", "not a user turn", timestamp=11.0)
    db.append_message("s", "user", "  line one\r\nline two  " + "x" * 80, timestamp=12.0)
    [row] = db.list_sessions_rich()
    assert set(db.get_session("s")) | {"preview", "last_active"} == set(row)
    assert row["preview"] == ("line one line two " + "x" * 80)[:60] + "..."
    assert row["last_active"] == 12.0


# --- counting, search_sessions, the dashboard's lookups -----------------------------------------


def test_search_sessions_carries_last_active_includes_archived_rows_and_orders_by_it(
    db: SessionDB,
) -> None:
    make(db, "a", 1.0, messages=1, last=50.0)
    make(db, "b", 2.0, archived=1)
    make(db, "c", 2.0)
    make(db, "d", 3.0, source="telegram")
    rows = db.search_sessions()
    assert ids(rows) == ["a", "d", "c", "b"]
    assert [r["last_active"] for r in rows] == [50.0, 3.0, 2.0, 2.0]
    assert ids(db.search_sessions("cli", 2, 1)) == ["c", "b"]


def test_search_sessions_by_id_ranks_exact_then_prefix_then_substring(db: SessionDB) -> None:
    make(db, "abc", 1.0, messages=1)
    make(db, "abcdef", 2.0, messages=1)
    make(db, "xabc", 3.0, messages=1)
    compressed(db, "zz-root", "zz-abc-cont", start=10.0)
    found = ids(db.search_sessions_by_id(" ABC "))
    assert found == ["abc", "abcdef", "zz-abc-cont", "xabc"]
    assert ids(db.search_sessions_by_id("zz-root")) == ["zz-abc-cont"]  # by its root id
    assert ids(db.search_sessions_by_id("abc", limit=2)) == ["abc", "abcdef"]
    assert db.search_sessions_by_id("   ") == [] and db.search_sessions_by_id("abc", 0) == []
    db.set_session_archived("abc", True)
    assert "abc" in ids(db.search_sessions_by_id("abc"))
    assert "abc" not in ids(db.search_sessions_by_id("abc", include_archived=False))


def test_list_cron_job_runs_selects_one_jobs_id_range(db: SessionDB) -> None:
    make(db, "cron_job1_a", 1.0, source="cron", messages=1)
    make(db, "cron_job1_b", 3.0, source="cron")
    make(db, "cron_job10_a", 2.0, source="cron")
    make(db, "cron_job1_c", 4.0, source="cli")  # not a cron session
    make(db, "cron_job1", 5.0, source="cron")
    runs = db.list_cron_job_runs("job1")
    assert ids(runs) == ["cron_job1_b", "cron_job1_a"]
    assert runs[1]["preview"] == "cron_job1_a turn 0"
    assert ids(db.list_cron_job_runs("job1", 1, 1)) == ["cron_job1_a"]
    assert db.list_cron_job_runs("nope") == []


@pytest.mark.parametrize("call", [
    lambda db: db.list_sessions_rich(limit="5"),
    lambda db: db.list_sessions_rich(offset=-1),
    lambda db: db.list_sessions_rich(min_message_count=None),
    lambda db: db.list_sessions_rich(cwd_prefix=3),
    lambda db: db.list_sessions_rich(order_by_last_active=True, search_query=7),
    lambda db: db.session_count(source=1),
    lambda db: db.search_sessions(limit=True),
    lambda db: db.list_cron_job_runs(None),
    lambda db: db.search_sessions_by_id(5),
])
def test_bad_arguments_are_refused_with_the_typed_error(db: SessionDB, call: Any) -> None:
    make(db, "kept", 1.0, messages=1)
    with pytest.raises(InvalidInputError):
        call(db)
    assert db.message_count("kept") == 1


# --- the resume target -----------------------------------------------------------------------


def test_resume_jumps_to_the_tip_then_walks_down_to_the_deepest_session_with_messages(
    db: SessionDB,
) -> None:
    compressed(db, "root", "tip")
    make(db, "untagged", 300.0, parent_session_id="tip", messages=1)  # tip is live
    make(db, "newest-empty", 310.0, parent_session_id="untagged")
    make(db, "branch", 400.0, parent_session_id="untagged", model_config=BRANCH, messages=1)
    make(db, "tool", 500.0, parent_session_id="newest-empty", source="tool", messages=1)
    assert db.resolve_resume_session_id("root") == "untagged"
    assert db.resolve_resume_session_id("newest-empty") == "newest-empty"  # none below: tip
    assert db.resolve_resume_session_id("unknown-id") == "unknown-id"
    assert db.resolve_resume_session_id("") == ""


def test_an_empty_tip_wins_over_a_parent_that_has_messages(db: SessionDB) -> None:
    make(db, "root", 1.0, messages=3, ended_at=5.0, end_reason="compression")
    make(db, "empty-tip", 10.0, parent_session_id="root")
    assert db.resolve_resume_session_id("root") == "empty-tip"


def test_the_walk_down_stops_after_32_steps(db: SessionDB) -> None:
    make(db, "n0", 0.0)
    for i in range(1, 40):
        make(db, f"n{i}", float(i), parent_session_id=f"n{i - 1}", messages=1)
    assert db.resolve_resume_session_id("n0") == "n32"


# --- titles ----------------------------------------------------------------------------------


def test_title_errors_name_what_is_wrong_in_the_callers_words(db: SessionDB) -> None:
    make(db, "holder", 1.0, title="Taken")
    make(db, "other", 2.0)
    with pytest.raises(TitleConflictError, match=r"'Taken' is already in use by .*holder"):
        db.set_session_title("other", "Taken")
    with pytest.raises(ValueError, match=r"too long: 101 characters \(maximum 100\)"):
        db.set_session_title("other", "x" * 101)
    with pytest.raises(InvalidInputError, match="too long"):
        SessionDB.sanitize_title("y" * 150)
    assert db.get_session_title("other") is None


def test_a_title_held_by_a_compression_ancestor_moves_to_the_continuation(db: SessionDB) -> None:
    compressed(db, "root", "middle", "tip")
    db.set_session_title("root", "Trip planning")
    assert db.set_session_title("tip", "Trip planning") is True
    assert (db.get_session_title("root"), db.get_session_title("tip")) == (None, "Trip planning")
    make(db, "branch", 500.0, parent_session_id="tip", model_config=BRANCH)
    with pytest.raises(TitleConflictError):  # a branch is not a continuation
        db.set_session_title("branch", "Trip planning")
    assert db.get_session_title("tip") == "Trip planning"


def test_contains_cjk_uses_the_seven_blocks() -> None:
    for text in ["漢字", "㐀", "\U00020000", "、", "ひらがな", "カタカナ", "한국어"]:
        assert SessionDB._contains_cjk(f"abc {text}")
    for text in ["plain", "", "ｱ", "\U0002a6e0", "ㄅ"]:
        assert not SessionDB._contains_cjk(text)


# --- pages of one order, on random stores ------------------------------------------------------


def _random_store(db: SessionDB, seed: int) -> None:
    r = random.Random(seed)
    made: list[str] = []
    for n in range(30):
        sid = f"s{n:02d}"
        parent = r.choice(made) if made and r.random() < 0.5 else None
        kind = r.random()
        columns: dict[str, Any] = {
            "source": r.choice(["cli", "cron", "telegram"]),
            "cwd": r.choice(["/a", "/a/b", "/ab", None]),
            "archived": int(r.random() < 0.2),
        }
        if parent is not None and kind < 0.2:
            columns["model_config"] = DELEGATE
        elif parent is not None and kind < 0.35:
            columns["model_config"] = BRANCH
        if r.random() < 0.4:
            columns.update(ended_at=r.uniform(0, 100),
                           end_reason=r.choice(["compression", "branched", "user"]))
        if r.random() < 0.3:
            columns["title"] = f"AN-{n} {r.choice(['x', 'y'])}"
        make(db, sid, float(r.randint(0, 50)), messages=r.randint(0, 3),
             last=r.uniform(0, 200), parent_session_id=parent, **columns)
        made.append(sid)


FILTERS = st.fixed_dictionaries({}, optional={
    "source": st.sampled_from(["cli", "cron"]),
    "exclude_sources": st.lists(st.sampled_from(["cli", "cron", "telegram"]), max_size=2),
    "cwd_prefix": st.sampled_from(["/a", "/a/", "/ab"]),
    "include_children": st.booleans(),
    "min_message_count": st.integers(0, 3),
    "include_archived": st.booleans(),
    "archived_only": st.booleans(),
    "order_by_last_active": st.booleans(),
    "search_query": st.sampled_from(["an", "s1", "x", "an-2"]),
    "project_compression_tips": st.booleans(),
})
COUNT_KEYS = ("source", "exclude_sources", "cwd_prefix", "min_message_count",
              "include_archived", "archived_only")


@pytest.mark.parametrize("seed", [1, 2, 3])
@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(filters=FILTERS, page=st.integers(1, 7))
def test_consecutive_pages_of_one_order_never_overlap_or_skip(
    tmp_path_factory: pytest.TempPathFactory, seed: int, filters: dict[str, Any], page: int,
) -> None:
    path = tmp_path_factory.getbasetemp() / f"listing-{seed}.db"
    with SessionDB(path) as db:
        if db.session_count(include_archived=True) == 0:
            _random_store(db, seed)
        whole = db.list_sessions_rich(limit=-1, **filters)
        paged: list[dict[str, Any]] = []
        for offset in range(0, len(whole) + page, page):
            paged += db.list_sessions_rich(limit=page, offset=offset, **filters)
        assert paged == whole
        assert len(set(ids(whole))) == len(whole)
        # The count pairs with the list (same filters, the picker's rule).
        searched = filters.get("order_by_last_active") and filters.get("search_query")
        if not searched:
            counted = db.session_count(
                **{k: filters[k] for k in COUNT_KEYS if k in filters},
                exclude_children=not filters.get("include_children", False),
            )
            assert counted == len(whole)
        keys = ([r["_lineage_root_id"] if "_lineage_root_id" in r else r["id"] for r in whole])
        rows = {r["id"]: r for r in db.search_sessions(limit=-1)}
        if filters.get("order_by_last_active"):
            ranks = [(_chain_activity(rows, k), rows[k]["started_at"], k) for k in keys]
        else:
            ranks = [(rows[k]["started_at"], k) for k in keys]
        assert ranks == sorted(ranks, reverse=True)


def _chain_activity(rows: dict[str, dict[str, Any]], root: str) -> float:
    """The reference: newest activity over the row and its continuation-edge descendants."""
    def marked(row: dict[str, Any]) -> bool:
        return row["model_config"] in (DELEGATE, BRANCH)

    best, todo, seen = rows[root]["last_active"], [root], {root}
    while todo:
        parent = todo.pop()
        if rows[parent]["end_reason"] != "compression":
            continue
        for child in rows.values():
            if (child["parent_session_id"] == parent and child["source"] != "tool"
                    and not marked(child) and child["id"] not in seen):
                seen.add(child["id"])
                todo.append(child["id"])
                best = max(best, child["last_active"])
    return float(best)


# --- with other processes writing ------------------------------------------------------------

_COMPRESSOR = """
import sys, time
from hermes_state import SessionDB
db = SessionDB(sys.argv[1])
conversations, n = int(sys.argv[2]), 0
tips = [f"c{k}" for k in range(conversations)]
print("ready", flush=True)
while True:
    n += 1
    for k in range(conversations):
        new = f"c{k}-{n}"
        db.end_session(tips[k], "compression")
        db.create_session(new, "cli", parent_session_id=tips[k])
        db.append_message(new, "user", f"summary {n}")
        tips[k] = new
    time.sleep(0.01)  # a turn's pace, not a tight loop that starves the other writer
"""
_TITLER = """
import sys, time
from hermes_state import SessionDB
db = SessionDB(sys.argv[1])
conversations = int(sys.argv[2])
print("ready", flush=True)
while True:
    for k in range(conversations):
        db.set_session_title(db.resolve_resume_session_id(f"c{k}"), f"Conv {k}")
    time.sleep(0.01)
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", [11, 12, 13])
def test_pickers_page_while_conversations_compress_and_titles_move_under_sigkill(
    db: SessionDB, spawn_python: Any, seed: int,
) -> None:
    """Listing never fails while other processes compress conversations and move their titles
    to each new tip; both are killed mid-write, and every title is then held by exactly one
    session of its conversation, every listed conversation appears once, and no message is
    lost."""
    import signal
    import sqlite3
    import time

    conversations = 4
    for k in range(conversations):
        make(db, f"c{k}", float(k), messages=1, title=f"Conv {k}")
    workers = [spawn_python(code, str(db.path), str(conversations))
               for code in (_COMPRESSOR, _TITLER)]
    try:
        for worker in workers:
            assert worker.stdout is not None and worker.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 1.0 + random.Random(seed).random()
        pages = 0
        while time.monotonic() < deadline:
            rows = db.list_sessions_rich(order_by_last_active=True, limit=conversations)
            assert len(rows) == conversations == len(set(ids(rows)))
            assert {r.get("_lineage_root_id", r["id"]) for r in rows} == {
                f"c{k}" for k in range(conversations)}
            assert db.session_count(exclude_children=True) == conversations
            pages += 1
        assert pages > 5
    finally:
        for worker in workers:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
    assert all(w.returncode == -signal.SIGKILL for w in workers), [
        w.stderr.read() for w in workers if w.stderr is not None]

    conn = sqlite3.connect(db.path)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        moved = 0
        for k in range(conversations):
            holders = conn.execute("SELECT id FROM sessions WHERE title = ?",
                                   (f"Conv {k}",)).fetchall()
            assert len(holders) == 1 and holders[0][0].startswith(f"c{k}")
            moved += holders[0][0] != f"c{k}"
        assert moved > 0
        # One message per segment: only the segment being created when the kill came may
        # still lack its first one.
        empty = [r[0] for r in conn.execute(
            "SELECT rowid FROM sessions s"
            " WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.session_id = s.id)")]
        newest = conn.execute("SELECT MAX(rowid) FROM sessions").fetchone()[0]
        assert empty in ([], [newest])
        assert conn.execute("SELECT COUNT(*) FROM messages GROUP BY session_id"
                            " HAVING COUNT(*) <> 1").fetchall() == []
    finally:
        conn.close()
    listed = db.list_sessions_rich(limit=50)
    assert sorted(r.get("_lineage_root_id", r["id"]) for r in listed) == [
        f"c{k}" for k in range(conversations)]
    for row in listed:
        assert row["id"] == db.get_compression_tip(row["_lineage_root_id"])
