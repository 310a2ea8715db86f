"""Archiving: deliberate archives, the idle clean-up, and what lifts an archive."""

from __future__ import annotations

import time

import pytest

from hermes_state import SessionDB

DAY = 86400.0


def flags(db: SessionDB, session_id: str) -> tuple[int, int]:
    row = db.get_session(session_id)
    assert row is not None
    return row["archived"], row["auto_archived"]


def idle_session(db: SessionDB, session_id: str, days: float = 40, **columns: object) -> str:
    """A session whose start and only message lie ``days`` in the past."""
    at = time.time() - days * DAY
    db.create_session(session_id, "cli", started_at=at, **columns)
    db.append_message(session_id, "user", f"hello from {session_id}", timestamp=at)
    return session_id


def split(
    db: SessionDB, parent: str, child: str, days: float = 40, **columns: object
) -> str:
    """Publish ``child`` as the compression successor of ``parent``, with old timestamps."""
    at = time.time() - days * DAY
    db.publish_compression_child(
        parent, child, "cli", [{"role": "user", "content": "summary", "timestamp": at}],
        started_at=at, **columns,
    )
    return child


# ---------------------------------------------------------------------------------------------
# Deliberate and automatic archives
# ---------------------------------------------------------------------------------------------


def test_a_deliberate_archive_clears_the_automatic_mark_and_unarchiving_clears_both(
    db: SessionDB,
) -> None:
    idle_session(db, "s1")
    assert db.auto_archive_idle_sessions(30) == 1
    assert flags(db, "s1") == (1, 1)
    db.set_session_archived("s1", True)
    assert flags(db, "s1") == (1, 0)
    db.set_session_archived("s1", False)
    assert flags(db, "s1") == (0, 0)


def test_archiving_an_unknown_session_is_false_and_a_non_bool_flag_is_refused(
    db: SessionDB,
) -> None:
    assert db.set_session_archived("nope", True) is False
    db.create_session("s1", "cli")
    with pytest.raises(TypeError):
        db.set_session_archived("s1", 1)
    assert flags(db, "s1") == (0, 0)


def test_reopening_lifts_the_automatic_archive_but_not_the_deliberate_one(db: SessionDB) -> None:
    idle_session(db, "auto")
    idle_session(db, "kept")
    db.set_session_archived("kept", True)
    assert db.auto_archive_idle_sessions(30) == 1
    db.end_session("auto", "idle")
    db.end_session("kept", "idle")

    db.reopen_session("auto")
    db.reopen_session("kept")

    assert flags(db, "auto") == (0, 0)
    assert flags(db, "kept") == (1, 0)
    assert db.get_session("kept")["ended_at"] is None, "the resume itself still happened"


def test_a_new_user_turn_lifts_only_the_automatic_archive(db: SessionDB) -> None:
    idle_session(db, "auto")
    idle_session(db, "kept")
    db.set_session_archived("kept", True)
    db.auto_archive_idle_sessions(30)

    db.append_message("auto", "user", "I am back")
    db.append_message("kept", "user", "I am back")

    assert flags(db, "auto") == (0, 0)
    assert flags(db, "kept") == (1, 0)


def test_observed_inputs_and_non_user_rows_do_not_resume_a_conversation(db: SessionDB) -> None:
    idle_session(db, "s1")
    db.auto_archive_idle_sessions(30)
    db.append_message("s1", "user", "seen in a group chat", observed=True)
    db.append_message("s1", "assistant", "a late reply")
    db.append_message("s1", "tool", "output", tool_call_id="call_1")
    assert flags(db, "s1") == (1, 1)


def test_an_input_written_on_the_gateway_exception_path_resumes_the_conversation(
    db: SessionDB,
) -> None:
    idle_session(db, "s1")
    db.auto_archive_idle_sessions(30)
    marker = db.ingress_owner_marker("telegram", None, None, "c1", None, "m-1")
    outcome, _ = db.persist_exception_input("s1", "hello again", marker=marker)
    assert outcome == "appended"
    assert flags(db, "s1") == (0, 0)


def test_in_place_compression_lifts_only_the_automatic_archive(db: SessionDB) -> None:
    idle_session(db, "auto")
    idle_session(db, "kept")
    db.set_session_archived("kept", True)
    db.auto_archive_idle_sessions(30)

    db.archive_and_compact("auto", [{"role": "user", "content": "summary"}])
    db.archive_and_compact("kept", [{"role": "user", "content": "summary"}])

    assert flags(db, "auto") == (0, 0)
    assert flags(db, "kept") == (1, 0)


def test_split_compression_lifts_the_automatic_archive_on_the_whole_conversation(
    db: SessionDB,
) -> None:
    idle_session(db, "root")
    split(db, "root", "middle")
    assert db.auto_archive_idle_sessions(30) == 2
    assert flags(db, "root") == flags(db, "middle") == (1, 1)

    db.publish_compression_child("middle", "tip", "cli", [{"role": "user", "content": "s"}])

    assert {flags(db, s) for s in ("root", "middle", "tip")} == {(0, 0)}


def test_split_compression_keeps_a_deliberate_archive_and_hands_it_to_the_child(
    db: SessionDB,
) -> None:
    idle_session(db, "kept")
    db.set_session_archived("kept", True)
    db.publish_compression_child("kept", "kept2", "cli", [{"role": "user", "content": "s"}])
    assert flags(db, "kept") == (1, 0)
    assert flags(db, "kept2") == (1, 0)
    assert db.list_sessions_rich() == []
    assert {r["id"] for r in db.search_sessions()} == {"kept", "kept2"}  # every row


def test_an_archive_covers_the_whole_compressed_conversation_from_any_member(
    db: SessionDB,
) -> None:
    idle_session(db, "root")
    split(db, "root", "tip")
    db.set_session_archived("tip", True)
    assert flags(db, "root") == (1, 0), "archiving the live tip hides the listed root too"
    db.set_session_archived("root", False)
    assert flags(db, "tip") == (0, 0)


def test_resuming_a_delegate_child_of_a_compressed_session_lifts_the_whole_conversation(
    db: SessionDB,
) -> None:
    idle_session(db, "root")
    idle_session(db, "delegate", parent_session_id="root")
    split(db, "root", "tip")
    assert db.auto_archive_idle_sessions(30) == 3

    db.reopen_session("delegate")

    assert {flags(db, s) for s in ("root", "delegate", "tip")} == {(0, 0)}


# ---------------------------------------------------------------------------------------------
# Lists and counts
# ---------------------------------------------------------------------------------------------


def test_lists_and_counts_hide_archived_sessions_unless_asked(db: SessionDB) -> None:
    idle_session(db, "deliberate")
    idle_session(db, "automatic")
    db.create_session("live", "cli")
    db.set_session_archived("deliberate", True)
    db.auto_archive_idle_sessions(30)

    assert [r["id"] for r in db.list_sessions_rich()] == ["live"]
    assert {r["id"] for r in db.search_sessions()} == {"live", "automatic", "deliberate"}
    assert db.session_count() == 1
    assert db.session_count(source="cli") == 1

    every = {"deliberate", "automatic", "live"}
    assert {r["id"] for r in db.list_sessions_rich(include_archived=True)} == every
    assert {r["id"] for r in db.search_sessions()} == every
    assert db.session_count(include_archived=True) == 3


def test_an_export_of_everything_includes_archived_sessions(db: SessionDB) -> None:
    idle_session(db, "deliberate")
    db.set_session_archived("deliberate", True)
    db.create_session("live", "cli")
    assert {e["id"] for e in db.export_all()} == {"deliberate", "live"}


# ---------------------------------------------------------------------------------------------
# The idle clean-up
# ---------------------------------------------------------------------------------------------


def test_the_idle_clean_up_skips_recent_pinned_and_already_archived_sessions(
    db: SessionDB,
) -> None:
    idle_session(db, "idle")
    idle_session(db, "recent", days=2)
    idle_session(db, "pinned", pinned=1)
    idle_session(db, "deliberate")
    db.set_session_archived("deliberate", True)
    # Started long ago, but its last message is recent: activity is what counts.
    db.create_session("old_but_active", "cli", started_at=time.time() - 90 * DAY)
    db.append_message("old_but_active", "user", "still here")
    # No message at all: its start is its last activity.
    db.create_session("empty", "cli", started_at=time.time() - 40 * DAY)

    assert db.auto_archive_idle_sessions(30) == 2
    assert flags(db, "idle") == flags(db, "empty") == (1, 1)
    assert flags(db, "recent") == flags(db, "pinned") == flags(db, "old_but_active") == (0, 0)
    assert flags(db, "deliberate") == (1, 0)
    assert db.auto_archive_idle_sessions(30) == 0


def test_the_idle_clean_up_skips_sessions_whose_ledgers_hold_live_work(db: SessionDB) -> None:
    idle_session(db, "queued")
    idle_session(db, "working")
    idle_session(db, "settled")
    epoch = db.begin_runtime_epoch("gateway-1")
    db.admit_input("queued", {"text": "pending"})
    db.register_worker_execution("exec-1", "working", epoch=epoch, kind="cron")
    admission = db.admit_input("settled", {"text": "done"})
    db.claim_next_input("settled", epoch=epoch)
    db.settle_input(admission["id"], epoch=epoch, outcome="completed")

    assert db.auto_archive_idle_sessions(30) == 1
    assert flags(db, "settled") == (1, 1)
    assert flags(db, "queued") == flags(db, "working") == (0, 0)


def test_an_idle_root_is_not_archived_while_its_compression_tip_is_active(
    db: SessionDB,
) -> None:
    idle_session(db, "root", days=60)
    db.publish_compression_child("root", "tip", "cli", [{"role": "user", "content": "s"}])
    db.append_message("tip", "user", "a fresh question")

    assert db.auto_archive_idle_sessions(30) == 0
    assert [r["_lineage_root_id"] for r in db.list_sessions_rich()] == ["root"]


def test_a_pinned_tip_keeps_its_whole_conversation_out_of_the_clean_up(db: SessionDB) -> None:
    idle_session(db, "root")
    split(db, "root", "tip", pinned=1)
    assert db.auto_archive_idle_sessions(30) == 0
    assert flags(db, "root") == (0, 0)


def test_the_idle_clean_up_can_be_limited_to_one_source(db: SessionDB) -> None:
    idle_session(db, "cli_session")
    at = time.time() - 40 * DAY
    db.create_session("tg_session", "telegram", started_at=at)
    assert db.auto_archive_idle_sessions(30, source="telegram") == 1
    assert flags(db, "tg_session") == (1, 1)
    assert flags(db, "cli_session") == (0, 0)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf")])
def test_the_idle_clean_up_refuses_a_meaningless_idle_period(db: SessionDB, bad: float) -> None:
    idle_session(db, "s1")
    with pytest.raises(ValueError):
        db.auto_archive_idle_sessions(bad)
    with pytest.raises(TypeError):
        db.auto_archive_idle_sessions("30")  # type: ignore[arg-type]
    assert flags(db, "s1") == (0, 0)
