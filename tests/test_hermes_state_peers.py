"""Gateway routing lookups: a key's current row, a chat's live session, a peer's recoverable
session, and recording a peer without touching the session's principal."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_state import InvalidInputError, SessionDB


def gateway_session(db: SessionDB, sid: str, started: float, *, source: str = "telegram",
                    key: str | None = "k1", **columns: object) -> None:
    db.create_session(sid, source, started_at=started, session_key=key, **columns)


# --- list_gateway_sessions -------------------------------------------------------------------


def test_each_key_lists_its_newest_row_with_last_active(db: SessionDB) -> None:
    gateway_session(db, "k1-old", 1.0)
    gateway_session(db, "k1-new", 2.0)
    gateway_session(db, "k2", 3.0, key="k2", source="Discord")
    gateway_session(db, "unkeyed", 4.0, key=None)
    gateway_session(db, "blank-key", 5.0, key="")
    db.append_message("k1-new", "user", "hi", timestamp=50.0)
    listed = db.list_gateway_sessions()
    assert [r["id"] for r in listed] == ["k1-new", "k2"]
    assert listed[0]["last_active"] == 50.0 and listed[1]["last_active"] == 3.0
    assert {k: v for k, v in listed[1].items() if k != "last_active"} == db.get_session("k2")


def test_platform_matches_any_case_and_active_only_drops_ended_keys(db: SessionDB) -> None:
    gateway_session(db, "tg", 1.0, key="a")
    gateway_session(db, "dc", 2.0, key="b", source="discord")
    gateway_session(db, "tg-ended", 3.0, key="c")
    db.end_session("tg-ended", "session_reset")
    assert [r["id"] for r in db.list_gateway_sessions(platform="TeleGram")] == ["tg"]
    assert [r["id"] for r in db.list_gateway_sessions(platform="telegram",
                                                      active_only=False)] == ["tg-ended", "tg"]
    assert db.list_gateway_sessions(platform="slack") == []


def test_a_key_whose_newest_row_ended_is_not_active(db: SessionDB) -> None:
    gateway_session(db, "live-older", 1.0)
    gateway_session(db, "ended-newer", 2.0)
    db.end_session("ended-newer", "session_reset")
    assert db.list_gateway_sessions() == []
    assert [r["id"] for r in db.list_gateway_sessions(active_only=False)] == ["ended-newer"]


# --- find_session_by_origin ------------------------------------------------------------------


def origin(db: SessionDB, sid: str, started: float, user: str | None, thread: str | None = None,
           *, chat: str = "100") -> None:
    gateway_session(db, sid, started, key=f"key-{sid}", chat_id=chat, thread_id=thread,
                    user_id=user)


def test_one_live_session_of_the_chat_is_found(db: SessionDB) -> None:
    origin(db, "s1", 1.0, "u1")
    assert db.find_session_by_origin(platform="TELEGRAM", chat_id=100) == "s1"
    assert db.find_session_by_origin(platform="telegram", chat_id="100", user_id="u1") == "s1"
    assert db.find_session_by_origin(platform="telegram", chat_id="101") is None
    assert db.find_session_by_origin(platform="discord", chat_id="100") is None


@pytest.mark.parametrize(("platform", "chat"), [("", "100"), (None, "100"), ("telegram", None),
                                                ("telegram", "")])
def test_no_platform_or_chat_finds_nothing(db: SessionDB, platform, chat) -> None:
    origin(db, "s1", 1.0, "u1")
    assert db.find_session_by_origin(platform=platform, chat_id=chat) is None


def test_the_thread_narrows_and_a_missing_thread_reads_as_empty(db: SessionDB) -> None:
    origin(db, "root", 1.0, "u1")
    origin(db, "topic", 2.0, "u1", thread="17")
    assert db.find_session_by_origin(platform="telegram", chat_id="100", thread_id=17) == "topic"
    assert db.find_session_by_origin(platform="telegram", chat_id="100", thread_id="") == "root"
    assert db.find_session_by_origin(platform="telegram", chat_id="100") == "topic"  # newest


def test_a_shared_chat_is_told_apart_by_sender_or_not_at_all(db: SessionDB) -> None:
    origin(db, "alice", 1.0, "alice")
    origin(db, "bob", 2.0, "bob")
    origin(db, "bob-ended", 3.0, "bob")
    db.end_session("bob-ended", "user_exit")
    assert db.find_session_by_origin(platform="telegram", chat_id="100") is None
    assert db.find_session_by_origin(platform="telegram", chat_id="100", user_id="alice") == (
        "alice")
    assert db.find_session_by_origin(platform="telegram", chat_id="100", user_id="carol") is None


def test_an_unmatched_sender_gets_the_only_candidate(db: SessionDB) -> None:
    origin(db, "s1", 1.0, "alice")
    assert db.find_session_by_origin(platform="telegram", chat_id="100", user_id="bob") == "s1"


def test_candidates_without_a_sender_do_not_count_as_other_senders(db: SessionDB) -> None:
    origin(db, "anon", 1.0, None)
    origin(db, "alice", 2.0, "alice")
    assert db.find_session_by_origin(platform="telegram", chat_id="100") == "alice"


# --- find_latest_gateway_session_for_peer ----------------------------------------------------


def peer(db: SessionDB, sid: str, started: float, *, key: str = "k1", messages: int = 1,
         **columns: object) -> None:
    gateway_session(db, sid, started, key=key, **columns)
    for n in range(messages):
        db.append_message(sid, "user", f"m{n}")


def test_without_a_key_nothing_is_found(db: SessionDB) -> None:
    peer(db, "s1", 1.0)
    for key in (None, ""):
        assert db.find_latest_gateway_session_for_peer(source="telegram", session_key=key) is None


def test_the_newest_recoverable_row_of_the_key_is_found(db: SessionDB) -> None:
    peer(db, "old", 1.0)
    peer(db, "closed-by-agent", 2.0)
    db.end_session("closed-by-agent", "agent_close")
    peer(db, "reset", 3.0)
    db.end_session("reset", "session_reset")
    peer(db, "empty", 4.0, messages=0)
    peer(db, "other-platform", 5.0, source="discord")
    found = db.find_latest_gateway_session_for_peer(source="telegram", session_key="k1")
    assert found == db.get_session("closed-by-agent")


def test_a_counted_message_is_content_even_without_rows(db: SessionDB) -> None:
    peer(db, "counted", 1.0, messages=0, message_count=3)
    assert db.find_latest_gateway_session_for_peer(
        source="telegram", session_key="k1")["id"] == "counted"


def test_failing_the_key_the_same_peer_is_found_when_chat_and_type_are_given(
    db: SessionDB,
) -> None:
    peer(db, "same-peer", 1.0, key="old-key", user_id="u1", chat_id="100", chat_type="dm")
    peer(db, "other-thread", 2.0, key="x", user_id="u1", chat_id="100", chat_type="dm",
         thread_id="9")
    args = {"source": "telegram", "session_key": "new-key", "user_id": "u1"}
    assert db.find_latest_gateway_session_for_peer(**args) is None
    assert db.find_latest_gateway_session_for_peer(**args, chat_id="100") is None
    assert db.find_latest_gateway_session_for_peer(
        **args, chat_id=100, chat_type="dm")["id"] == "same-peer"
    assert db.find_latest_gateway_session_for_peer(
        **args, chat_id="100", chat_type="dm", thread_id="9")["id"] == "other-thread"


# --- record_gateway_session_peer, set_expiry_finalized ---------------------------------------


def test_recording_a_peer_repoints_the_routing_columns_and_keeps_the_principal(
    db: SessionDB,
) -> None:
    db.create_session("s1", "cli", user_id="alice", chat_type="group", thread_id="5",
                      display_name="Team", origin_json='{"a": 1}')
    db.record_gateway_session_peer("s1", source="telegram", user_id="mallory",
                                   session_key="tg:dm:100", chat_id=100)
    row = db.get_session("s1")
    assert (row["session_key"], row["source"], row["chat_id"], row["chat_type"],
            row["thread_id"]) == ("tg:dm:100", "telegram", "100", None, None)
    assert (row["display_name"], row["origin_json"]) == ("Team", '{"a": 1}')
    assert row["user_id"] == "alice"  # fixed when the row was created
    db.record_gateway_session_peer("s1", source="telegram", session_key="tg:dm:100",
                                   display_name="Ana", origin_json='{"b": 2}')
    row = db.get_session("s1")
    assert (row["display_name"], row["origin_json"]) == ("Ana", '{"b": 2}')


@pytest.mark.parametrize(("session_id", "key"), [("", "k"), ("s1", ""), ("s1", None),
                                                 ("ghost", "k")])
def test_recording_without_an_id_or_a_key_or_for_an_unknown_id_changes_nothing(
    db: SessionDB, session_id: str, key: str | None
) -> None:
    db.create_session("s1", "cli", session_key="before")
    before = db.get_session("s1")
    db.record_gateway_session_peer(session_id, source="telegram", session_key=key, chat_id="1")
    assert db.get_session("s1") == before
    assert db.get_session("ghost") is None


@pytest.mark.parametrize("source", [None, ""])
def test_recording_needs_a_platform(db: SessionDB, source: str | None) -> None:
    db.create_session("s1", "cli")
    with pytest.raises(InvalidInputError):
        db.record_gateway_session_peer("s1", source=source, session_key="k")


def test_expiry_finalized_is_set_and_cleared(db: SessionDB) -> None:
    db.create_session("s1", "telegram")
    db.set_expiry_finalized("s1")
    assert db.get_session("s1")["expiry_finalized"] == 1
    db.set_expiry_finalized("s1", False)
    assert db.get_session("s1")["expiry_finalized"] == 0
    db.set_expiry_finalized("", True)
    db.set_expiry_finalized("ghost", True)
    assert db.get_session("ghost") is None


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(chat=st.one_of(st.text(min_size=1, max_size=20), st.integers()),
       thread=st.one_of(st.none(), st.text(max_size=10), st.integers()))
def test_a_recorded_peer_is_found_by_its_origin_ids_of_any_text(
    db: SessionDB, chat: object, thread: object
) -> None:
    db.create_session("s1", "telegram", user_id="u1")
    db.record_gateway_session_peer("s1", source="Telegram", session_key="k", chat_id=chat,
                                   thread_id=thread)
    assert db.find_session_by_origin(platform="telegram", chat_id=str(chat)) == "s1"
    assert db.find_session_by_origin(platform="telegram", chat_id=chat,
                                     thread_id="" if thread is None else thread) == "s1"
