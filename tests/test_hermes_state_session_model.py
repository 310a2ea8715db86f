"""In-place switches of what a session runs on: model, model configuration, billing route."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hermes_state import InvalidInputError, SessionDB, StateDbClosedError


@pytest.fixture
def session(db: SessionDB) -> SessionDB:
    db.create_session("s1", "telegram", model="old-model", system_prompt="You are old-model.",
                      model_config={"_delegate_from": "parent", "temperature": 0.2},
                      billing_provider="openai", billing_base_url="https://a", billing_mode="api")
    return db


def test_meta_replaces_the_config_text_whole_and_keeps_the_model_unless_given(
    session: SessionDB,
) -> None:
    text = '{"temperature": 0.7,  "max_tokens": 10}'
    assert session.update_session_meta("s1", text) is None
    row = session.get_session("s1")
    assert (row["model_config"], row["model"]) == (text, "old-model")  # markers gone, as given
    session.update_session_meta("s1", "{}", model="new-model")
    row = session.get_session("s1")
    assert (row["model_config"], row["model"], row["system_prompt"]) == (
        "{}", "new-model", "You are old-model.")


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(config=st.dictionaries(st.text(max_size=10), st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=20)), max_size=5),
    indent=st.sampled_from([None, 0, 2]))
def test_any_json_object_text_is_stored_byte_for_byte(
    session: SessionDB, config: dict, indent: int | None
) -> None:
    text = json.dumps(config, indent=indent, ensure_ascii=False)
    session.update_session_meta("s1", text)
    assert session.get_session("s1")["model_config"] == text


@pytest.mark.parametrize("text", ["", "not json", "[1, 2]", '"x"', "null", None, {"a": 1}])
def test_text_that_is_not_a_json_object_is_refused_and_nothing_changes(
    session: SessionDB, text: object
) -> None:
    before = session.get_session("s1")
    with pytest.raises(InvalidInputError):
        session.update_session_meta("s1", text)
    assert session.get_session("s1") == before


def test_the_model_is_set_whatever_it_was(session: SessionDB) -> None:
    session.update_session_model("s1", "new-model")
    row = session.get_session("s1")
    assert (row["model"], row["system_prompt"]) == ("new-model", "You are old-model.")
    session.update_token_counts("s1", 1, 1, model="usage-model")  # only fills a NULL model
    assert session.get_session("s1")["model"] == "new-model"


def test_a_route_switch_sets_provider_and_url_and_drops_the_cached_prompt(
    session: SessionDB,
) -> None:
    session.update_session_billing_route("s1", provider="anthropic", base_url="https://b")
    row = session.get_session("s1")
    assert (row["billing_provider"], row["billing_base_url"], row["billing_mode"],
            row["system_prompt"]) == ("anthropic", "https://b", "api", None)
    session.update_session_billing_route("s1", provider="openrouter", base_url="https://c",
                                         billing_mode="subscription")
    assert session.get_session("s1")["billing_mode"] == "subscription"


def test_unknown_sessions_change_nothing_and_raise_nothing(session: SessionDB) -> None:
    session.update_session_meta("ghost", "{}", model="m")
    session.update_session_model("ghost", "m")
    session.update_session_billing_route("ghost", provider="p", base_url="u")
    assert session.get_session("ghost") is None


@pytest.mark.parametrize("call", [
    lambda db: db.update_session_model("s1", 3),
    lambda db: db.update_session_meta("s1", "{}", model=["m"]),
    lambda db: db.update_session_billing_route("s1", provider=None, base_url=1),
])
def test_a_value_of_the_wrong_kind_is_refused(session: SessionDB, call) -> None:
    before = session.get_session("s1")
    with pytest.raises(InvalidInputError):
        call(session)
    assert session.get_session("s1") == before


def test_the_route_arguments_are_keyword_only(session: SessionDB) -> None:
    with pytest.raises(TypeError):
        session.update_session_billing_route("s1", "anthropic", "https://b")


def test_a_closed_handle_refuses_the_switches(db_path: Path) -> None:
    db = SessionDB(db_path)
    db.close()
    for call in (lambda: db.update_session_meta("s1", "{}"),
                 lambda: db.update_session_model("s1", "m"),
                 lambda: db.update_session_billing_route("s1", provider="p", base_url="u")):
        with pytest.raises(StateDbClosedError):
            call()
