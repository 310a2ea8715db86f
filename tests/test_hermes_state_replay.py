"""Reasoning carriers per route, the rejection memo and retry, and Codex turn-start echoes."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hermes_state_replay as rt
from hermes_state_replay import (
    ReasoningFieldMemo,
    gateway_should_persist,
    resolve_reasoning_route,
    rich_input_to_text,
    route_reasoning_carriers,
    send_with_reasoning_retry,
    suppress_turn_start_echo,
)

RC, R, RD = "reasoning_content", "reasoning", "reasoning_details"
ALL = frozenset({RC, R, RD})
TOOL_CALLS = [{"id": "call_1", "type": "function",
               "function": {"name": "terminal", "arguments": "{}"}}]


def assistant(**fields: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": "answer", "message_uid": "a" * 32, **fields}


def carriers_of(message: dict[str, Any]) -> frozenset[str]:
    return frozenset(message) & ALL


# ---------------------------------------------------------------------------------------------
# Route table: every route the replay rules name
# ---------------------------------------------------------------------------------------------

# (provider, base_url, model) -> (route name, carriers, padded)
ROUTE_CASES = [
    # default, everywhere else
    (("openai", "https://api.openai.com/v1", "gpt-5"), ("default", {RC}, False)),
    (("anthropic", None, "claude-sonnet-4.6"), ("default", {RC}, False)),
    (("custom", "https://llm.example.com/v1", "some-model"), ("default", {RC}, False)),
    (("", None, None), ("default", {RC}, False)),
    # OpenRouter-style gateways: the default plus reasoning and reasoning_details
    (("openrouter", None, "deepseek/deepseek-r1"), ("openrouter", {RC, R, RD}, False)),
    (("custom", "https://openrouter.ai/api/v1", "x"), ("openrouter", {RC, R, RD}, False)),
    (("kilocode", None, None), ("kilo", {RC, R, RD}, False)),
    (("custom", "https://api.kilo.ai/api/gateway", None), ("kilo", {RC, R, RD}, False)),
    (("ai-gateway", None, None), ("vercel-ai-gateway", {RC, R, RD}, False)),
    (("custom", "https://ai-gateway.vercel.sh/v1", None),
     ("vercel-ai-gateway", {RC, R, RD}, False)),
    (("nous", None, "Hermes-4-405B"), ("nous-portal", {RC, R, RD}, False)),
    (("custom", "https://inference-api.nousresearch.com/v1", None),
     ("nous-portal", {RC, R, RD}, False)),
    # reasoning_details only
    (("novita", None, "deepseek/deepseek-v3"), ("novita", {RD}, False)),
    (("custom", "https://api.novita.ai/openai", None), ("novita", {RD}, False)),
    (("minimax", "https://api.minimax.io/v1", "MiniMax-M2"), ("minimax", {RD}, False)),
    (("custom", "https://api.minimaxi.com/v1", None), ("minimax", {RD}, False)),
    (("minimax", None, "MiniMax-M2"), ("minimax", {RD}, False)),
    (("minimax", "https://api.minimax.io/anthropic", "MiniMax-M2"), ("default", {RC}, False)),
    (("tokenhub", None, None), ("tokenhub", {RD}, False)),
    # reasoning only
    (("custom", "http://localhost:8080/v1", "qwen3"), ("local", {R}, False)),
    (("custom", "http://127.0.0.1:1234/v1", None), ("local", {R}, False)),
    (("custom", "http://192.168.1.20:8000/v1", None), ("local", {R}, False)),
    (("custom", "http://gpu-box.local:8000/v1", None), ("local", {R}, False)),
    (("lmstudio", None, None), ("local", {R}, False)),
    (("vllm", None, None), ("local", {R}, False)),
    (("ollama", "http://localhost:11434/v1", "qwen3"), ("ollama", {R}, False)),
    (("custom", "https://ollama.com/v1", None), ("ollama", {R}, False)),
    (("upstage", None, "solar-pro2"), ("upstage", {R}, False)),
    (("custom", "https://api.upstage.ai/v1", None), ("upstage", {R}, False)),
    # strict schemas: nothing
    (("mistral", None, "magistral-medium"), ("mistral", set(), False)),
    (("custom", "https://api.mistral.ai/v1", None), ("mistral", set(), False)),
    (("groq", None, "deepseek-r1-distill-llama-70b"), ("groq", set(), False)),
    (("custom", "https://api.groq.com/openai/v1", None), ("groq", set(), False)),
    (("cerebras", None, None), ("cerebras", set(), False)),
    (("custom", "https://api.cerebras.ai/v1", None), ("cerebras", set(), False)),
    (("sambanova", None, "DeepSeek-R1"), ("sambanova", set(), False)),
    (("custom", "https://api.sambanova.ai/v1", None), ("sambanova", set(), False)),
    # Fireworks: reasoning_content only, no padding even for a DeepSeek or Kimi model
    (("fireworks", None, "accounts/fireworks/models/kimi-k2"), ("fireworks", {RC}, False)),
    (("custom", "https://api.fireworks.ai/inference/v1", "deepseek-v3"),
     ("fireworks", {RC}, False)),
    # padded routes
    (("deepseek", None, "deepseek-reasoner"), ("deepseek", {RC}, True)),
    (("custom", "https://api.deepseek.com/v1", None), ("deepseek", {RC}, True)),
    (("custom", "https://llm.example.com/v1", "deepseek-ai/DeepSeek-V3.1"),
     ("deepseek", {RC}, True)),
    (("kimi-coding", None, None), ("kimi", {RC}, True)),
    (("Moonshot", "https://api.moonshot.ai/v1", "kimi-k2-thinking"), ("kimi", {RC}, True)),
    (("custom", "https://api.moonshot.cn/v1", None), ("kimi", {RC}, True)),
    (("custom", None, "moonshotai/Kimi-K2-Thinking"), ("kimi", {RC}, True)),
    (("xiaomi", None, "mimo-v2-flash"), ("mimo", {RC}, True)),
    (("custom", "https://api.xiaomimimo.com/v1", None), ("mimo", {RC}, True)),
    (("custom", None, "XiaomiMiMo/MiMo-V2-Flash"), ("mimo", {RC}, True)),
]


@pytest.mark.parametrize(("request_", "expected"), ROUTE_CASES)
def test_every_route_resolves_to_its_carriers(
    request_: tuple[str, str | None, str | None], expected: tuple[str, set[str], bool]
) -> None:
    provider, base_url, model = request_
    name, carriers, padded = expected
    route = resolve_reasoning_route(provider, base_url, model)
    assert (route.name, set(route.carriers), route.pad_tool_calls) == (name, carriers, padded)


@pytest.mark.parametrize(("request_", "expected"), ROUTE_CASES)
def test_assistant_turn_with_reasoning_carries_exactly_the_route_fields(
    request_: tuple[str, str | None, str | None], expected: tuple[str, set[str], bool]
) -> None:
    provider, base_url, model = request_
    _, carriers, _ = expected
    history = [
        {"role": "user", "content": "hi"},
        assistant(reasoning="thinking", reasoning_content="thinking", tool_calls=TOOL_CALLS),
    ]
    out = route_reasoning_carriers(history, provider=provider, base_url=base_url, model=model)
    assert carriers_of(out[1]) == carriers
    assert carriers_of(out[0]) == frozenset()
    for field in carriers & {RC, R}:
        assert out[1][field] == "thinking"
    if RD in carriers:
        assert out[1][RD] == [{"type": "reasoning.text", "text": "thinking"}]


@pytest.mark.parametrize(("request_", "expected"), ROUTE_CASES)
def test_tool_call_turn_without_reasoning_is_padded_only_on_padding_routes(
    request_: tuple[str, str | None, str | None], expected: tuple[str, set[str], bool]
) -> None:
    provider, base_url, model = request_
    _, _, padded = expected
    history = [assistant(content=None, tool_calls=TOOL_CALLS), assistant()]
    out = route_reasoning_carriers(history, provider=provider, base_url=base_url, model=model)
    if padded:
        assert out[0][RC] == " "
        assert carriers_of(out[0]) == {RC}
    else:
        assert carriers_of(out[0]) == frozenset()
    # A plain answer without tool calls is never padded.
    assert carriers_of(out[1]) == frozenset()


def test_route_table_has_exactly_the_named_routes() -> None:
    names = {route.name for route in rt.REASONING_ROUTES}
    assert names == {
        "openrouter", "kilo", "vercel-ai-gateway", "nous-portal", "novita", "minimax",
        "tokenhub", "local", "ollama", "upstage", "mistral", "groq", "cerebras", "sambanova",
        "fireworks", "deepseek", "kimi", "mimo",
    }
    padded = {route.name for route in rt.REASONING_ROUTES if route.pad_tool_calls}
    assert padded == {"deepseek", "kimi", "mimo"}
    assert rt.DEFAULT_ROUTE.carriers == {RC} and not rt.DEFAULT_ROUTE.pad_tool_calls


def test_provider_name_wins_over_host_and_model() -> None:
    route = resolve_reasoning_route("groq", "https://api.deepseek.com/v1", "deepseek-reasoner")
    assert route.name == "groq"
    assert resolve_reasoning_route("OpenRouter", None, "deepseek/deepseek-r1").name == "openrouter"
    assert resolve_reasoning_route("Kilo_Code", None, None).name == "kilo"


def test_host_match_requires_the_domain_or_a_subdomain() -> None:
    assert resolve_reasoning_route("custom", "https://notopenrouter.ai/v1").name == "default"
    assert resolve_reasoning_route("custom", "https://eu.openrouter.ai/v1").name == "openrouter"
    assert resolve_reasoning_route("custom", "openrouter.ai/api/v1").name == "openrouter"


# ---------------------------------------------------------------------------------------------
# Which stored value fills which carrier
# ---------------------------------------------------------------------------------------------


def test_each_field_replays_its_own_stored_value_byte_for_byte() -> None:
    details = [{"type": "reasoning.text", "text": "det", "signature": "sig", "index": 0}]
    history = [assistant(reasoning="raw", reasoning_content="rc", reasoning_details=details)]
    [out] = route_reasoning_carriers(history, provider="openrouter")
    assert (out[R], out[RC], out[RD]) == ("raw", "rc", details)


def test_text_route_takes_the_text_of_stored_details() -> None:
    details = [
        {"type": "reasoning.text", "text": "first "},
        {"type": "reasoning.encrypted", "data": "opaque"},
        {"type": "reasoning.summary", "summary": "second"},
    ]
    [out] = route_reasoning_carriers([assistant(reasoning_details=details)], provider="ollama")
    assert out == {"role": "assistant", "content": "answer", R: "first second"}


def test_details_route_builds_the_minimal_structured_form_from_text() -> None:
    [out] = route_reasoning_carriers([assistant(reasoning="why")], provider="novita")
    assert out[RD] == [{"type": "reasoning.text", "text": "why"}]


def test_details_stored_as_a_json_string_are_decoded() -> None:
    stored = '[{"type": "reasoning.text", "text": "t"}]'
    [out] = route_reasoning_carriers([assistant(reasoning_details=stored)], provider="minimax")
    assert out[RD] == [{"type": "reasoning.text", "text": "t"}]


def test_text_field_falls_back_to_the_other_stored_text() -> None:
    [out] = route_reasoning_carriers([assistant(reasoning="only raw")], provider="deepseek")
    assert out[RC] == "only raw"
    [out] = route_reasoning_carriers([assistant(reasoning_content="only rc")], provider="local")
    assert out[R] == "only rc"


def test_stored_reasoning_suppresses_padding() -> None:
    history = [assistant(tool_calls=TOOL_CALLS, reasoning="real")]
    [out] = route_reasoning_carriers(history, provider="kimi")
    assert out[RC] == "real"


def test_reasoning_only_reply_replays_api_content() -> None:
    turn = assistant(content="", reasoning="the reply", reasoning_content="the reply",
                     api_content="the reply", finish_reason="stop")
    [out] = route_reasoning_carriers([turn], provider="openai")
    assert out == {"role": "assistant", "content": "the reply", RC: "the reply"}


def test_non_assistant_turns_keep_only_provider_keys() -> None:
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "sys", "message_uid": "1" * 32, "_row_id": 1},
        {"role": "user", "content": "hi", "display_kind": "x", "display_metadata": {"a": 1},
         "reasoning": "not an assistant", "platform_message_id": "m1"},
        {"role": "tool", "content": "ok", "tool_call_id": "call_1", "name": "terminal",
         "_tool_call_uid": "2" * 32, "tool_name": "terminal"},
    ]
    out = route_reasoning_carriers(history, provider="openrouter")
    assert out == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "tool", "content": "ok", "tool_call_id": "call_1", "name": "terminal"},
    ]


def test_runtime_and_codex_keys_never_leave_an_assistant_turn() -> None:
    turn = assistant(
        tool_calls=TOOL_CALLS, reasoning="r", _row_id=7, _absorbed_message_uids=["b" * 32],
        _tool_call_uids={"call_1": "c" * 32}, codex_reasoning_items=[{"id": "rs_1"}],
        codex_message_items=[{"id": "msg_1"}], display_kind="reasoning", finish_reason="stop",
        token_count=3, timestamp=1.0,
    )
    [out] = route_reasoning_carriers([turn], provider="openrouter")
    assert set(out) == {"role", "content", "tool_calls", RC, R, RD}


def test_output_is_a_deep_copy() -> None:
    details = [{"type": "reasoning.text", "text": "t"}]
    history = [assistant(tool_calls=copy.deepcopy(TOOL_CALLS), reasoning_details=details)]
    before = copy.deepcopy(history)
    [out] = route_reasoning_carriers(history, provider="openrouter")
    out["tool_calls"][0]["id"] = "changed"
    out[RD][0]["text"] = "changed"
    assert history == before


# ---------------------------------------------------------------------------------------------
# Open-ended inputs
# ---------------------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=6,
)
_keys = st.sampled_from([
    "role", "content", "tool_calls", "tool_call_id", "name", R, RC, RD, "api_content",
    "message_uid", "_row_id", "_absorbed_message_uids", "_tool_call_uids", "_tool_call_uid",
    "display_kind", "display_metadata", "codex_reasoning_items", "codex_message_items",
    "finish_reason", "platform_message_id",
]) | st.text(max_size=10)
_known = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"])},
    optional={
        R: st.text(max_size=10) | st.none(),
        RC: st.text(max_size=10) | st.none(),
        RD: _json,
        "tool_calls": st.just(TOOL_CALLS) | st.none(),
    },
)
_message = st.builds(lambda extra, known: {**extra, **known},
                     st.dictionaries(_keys, _json, max_size=6), _known)
_routes = st.sampled_from([case[0] for case in ROUTE_CASES])
_provider_keys = set(rt.PROVIDER_KEYS)


@settings(max_examples=300)
@given(st.lists(_message, max_size=6), _routes,
       st.frozensets(st.sampled_from(sorted(ALL))))
def test_input_is_never_mutated_and_only_provider_keys_leave(
    history: list[dict[str, Any]], route: tuple[str, str | None, str | None],
    dropped: frozenset[str],
) -> None:
    provider, base_url, model = route
    before = copy.deepcopy(history)
    out = route_reasoning_carriers(history, provider=provider, base_url=base_url, model=model,
                                   rejected=dropped)
    assert history == before
    assert len(out) == len(history)
    carriers = resolve_reasoning_route(provider, base_url, model).carriers - dropped
    for message, sent in zip(history, out):
        allowed = _provider_keys | (carriers if message.get("role") == "assistant" else set())
        assert set(sent) <= allowed
        assert not any(key.startswith("_") for key in sent)
        assert "message_uid" not in sent and "display_metadata" not in sent
        assert sent is not message


# ---------------------------------------------------------------------------------------------
# The rejection memo and the single retry
# ---------------------------------------------------------------------------------------------

RECOGNISED = [
    ("Extra inputs are not permitted, field: messages[3].reasoning_details", RD),
    ("Error code: 400 - {'error': {'message': \"Extra inputs are not permitted, field: "
     "'messages[1].reasoning'\"}}", R),
    ("extra inputs are not permitted (type=extra_forbidden), field: body.messages.2."
     "reasoning_content", RC),
    ("Unrecognized request argument supplied: reasoning_content", RC),
    ("Unrecognized request arguments supplied: reasoning_details", RD),
    ('json: unknown field "reasoning"', R),
    ("unknown field `reasoning_content`, expected one of `role`, `content`", RC),
    ("invalid request: unknown field 'messages[0].reasoning_details'", RD),
    ("property 'reasoning' is not allowed", R),
    ("messages.1: property 'reasoning_content' is unsupported, did you mean 'reasoning'?", RC),
    ('property "reasoning_details" is not allowed', RD),
]

NOT_RECOGNISED = [
    "Missing reasoning_content field in the assistant message at message index 3",
    "Extra inputs are not permitted, field: messages[3].thinking",
    "Unrecognized request argument supplied: reasoning_effort",
    'unknown field "reasoning_summary"',
    "property 'tool_choice' is not allowed",
    "Rate limit exceeded",
    "",
]


@pytest.mark.parametrize(("text", "field"), RECOGNISED)
def test_memo_records_the_field_named_by_each_recognised_rejection(text: str, field: str) -> None:
    memo = ReasoningFieldMemo()
    assert memo.record_rejection(text, provider="p", base_url="https://h.example/v1",
                                 model="m") == field
    assert memo.rejected_fields("p", "https://h.example/v1", "m") == {field}


@pytest.mark.parametrize("text", NOT_RECOGNISED)
def test_memo_ignores_texts_that_name_no_refused_carrier(text: str) -> None:
    memo = ReasoningFieldMemo()
    assert memo.record_rejection(text, provider="p") is None
    assert memo.rejected_fields("p") == frozenset()


def test_memo_records_every_field_a_text_names_and_returns_the_first() -> None:
    memo = ReasoningFieldMemo()
    text = ("Extra inputs are not permitted, field: messages[1].reasoning; "
            "Extra inputs are not permitted, field: messages[1].reasoning_details")
    assert memo.record_rejection(text, provider="p") == R
    assert memo.rejected_fields("p") == {R, RD}


def test_memo_is_scoped_to_provider_host_and_model() -> None:
    memo = ReasoningFieldMemo()
    memo.record_rejection("property 'reasoning' is not allowed", provider="openrouter",
                          base_url="https://openrouter.ai/api/v1", model="a/b")
    assert memo.rejected_fields("OpenRouter", "https://openrouter.ai/other", "A/B") == {R}
    assert memo.rejected_fields("kilo", "https://openrouter.ai/api/v1", "a/b") == frozenset()
    assert memo.rejected_fields("openrouter", "https://eu.openrouter.ai/v1", "a/b") == frozenset()
    assert memo.rejected_fields("openrouter", "https://openrouter.ai/api/v1", "c") == frozenset()
    assert memo.rejected_fields("openrouter", None, "a/b") == frozenset()


def test_memo_tells_local_servers_apart_by_port() -> None:
    memo = ReasoningFieldMemo()
    memo.record_rejection('unknown field "reasoning"', provider="custom",
                          base_url="http://localhost:8080/v1", model="m")
    assert memo.rejected_fields("custom", "http://localhost:8080/v1", "m") == {R}
    assert memo.rejected_fields("custom", "http://localhost:11434/v1", "m") == frozenset()


def test_routing_drops_memoised_fields_for_that_combination_only() -> None:
    memo = ReasoningFieldMemo()
    memo.record_rejection("Extra inputs are not permitted, field: messages[0].reasoning_details",
                          provider="openrouter", model="m1")
    history = [assistant(reasoning="r")]
    [dropped] = route_reasoning_carriers(history, provider="openrouter", model="m1",
                                         rejected=memo)
    [kept] = route_reasoning_carriers(history, provider="openrouter", model="m2", rejected=memo)
    assert carriers_of(dropped) == {RC, R}
    assert carriers_of(kept) == {RC, R, RD}


def test_memoised_reasoning_content_also_drops_padding() -> None:
    memo = ReasoningFieldMemo()
    memo.record_rejection("Unrecognized request argument supplied: reasoning_content",
                          provider="deepseek")
    [out] = route_reasoning_carriers([assistant(tool_calls=TOOL_CALLS)], provider="deepseek",
                                     rejected=memo)
    assert carriers_of(out) == frozenset()


def test_memo_is_thread_safe() -> None:
    memo = ReasoningFieldMemo()
    texts = [f"property '{field}' is not allowed" for field in (R, RC, RD)]

    def work(i: int) -> None:
        for j in range(200):
            memo.record_rejection(texts[(i + j) % 3], provider="p", model=str(j % 5))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for j in range(5):
        assert memo.rejected_fields("p", None, str(j)) == ALL


class ProviderError(Exception):
    pass


class Recorder:
    """A ``send`` that fails with the scripted errors, then returns ``"ok"``."""

    def __init__(self, *errors: str) -> None:
        self.errors = list(errors)
        self.calls: list[list[dict[str, Any]]] = []

    def __call__(self, messages: list[dict[str, Any]]) -> str:
        self.calls.append(copy.deepcopy(messages))
        if self.errors:
            raise ProviderError(self.errors.pop(0))
        return "ok"


def gateway_history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "q", "message_uid": "1" * 32},
        assistant(reasoning="r", reasoning_details=[{"type": "reasoning.text", "text": "r"}],
                  tool_calls=TOOL_CALLS, _row_id=2),
        {"role": "tool", "content": "ok", "tool_call_id": "call_1", "_tool_call_uid": "3" * 32},
    ]


def test_send_succeeds_without_retry() -> None:
    memo, send, history = ReasoningFieldMemo(), Recorder(), gateway_history()
    assert send_with_reasoning_retry(send, history, provider="openrouter", memo=memo) == "ok"
    assert len(send.calls) == 1 and carriers_of(send.calls[0][1]) == {RC, R, RD}


def test_named_rejection_is_recorded_and_retried_once_without_the_field() -> None:
    memo, history = ReasoningFieldMemo(), gateway_history()
    before = copy.deepcopy(history)
    send = Recorder("Extra inputs are not permitted, field: messages[1].reasoning_details")
    result = send_with_reasoning_retry(send, history, provider="openrouter",
                                       base_url="https://openrouter.ai/api/v1", model="x/y",
                                       memo=memo)
    assert result == "ok"
    assert [carriers_of(call[1]) for call in send.calls] == [{RC, R, RD}, {RC, R}]
    assert memo.rejected_fields("openrouter", "https://openrouter.ai/api/v1", "x/y") == {RD}
    assert history == before
    # The next request of the session leaves the field out from the start.
    later = Recorder()
    send_with_reasoning_retry(later, history, provider="openrouter",
                              base_url="https://openrouter.ai/api/v1", model="x/y", memo=memo)
    assert len(later.calls) == 1 and carriers_of(later.calls[0][1]) == {RC, R}


def test_second_failure_propagates_after_exactly_one_retry() -> None:
    memo, history = ReasoningFieldMemo(), gateway_history()
    before = copy.deepcopy(history)
    send = Recorder("property 'reasoning' is not allowed",
                    "property 'reasoning_content' is not allowed")
    with pytest.raises(ProviderError, match="reasoning_content"):
        send_with_reasoning_retry(send, history, provider="openrouter", memo=memo)
    assert len(send.calls) == 2
    assert history == before
    # The second rejection is learnt for the next request, but not retried now.
    assert memo.rejected_fields("openrouter") == {R, RC}


def test_unrecognised_error_propagates_without_retry() -> None:
    memo, send = ReasoningFieldMemo(), Recorder("Rate limit exceeded")
    with pytest.raises(ProviderError, match="Rate limit"):
        send_with_reasoning_retry(send, gateway_history(), provider="openrouter", memo=memo)
    assert len(send.calls) == 1 and memo.rejected_fields("openrouter") == frozenset()


def test_rejection_of_a_field_not_sent_propagates_without_retry() -> None:
    memo, send = ReasoningFieldMemo(), Recorder("property 'reasoning' is not allowed")
    with pytest.raises(ProviderError):
        send_with_reasoning_retry(send, gateway_history(), provider="deepseek", memo=memo)
    assert len(send.calls) == 1


def test_retry_leaves_other_combinations_untouched() -> None:
    memo = ReasoningFieldMemo()
    send = Recorder("Unrecognized request argument supplied: reasoning_content")
    send_with_reasoning_retry(send, gateway_history(), provider="custom",
                              base_url="https://a.example/v1", model="m", memo=memo)
    other = Recorder()
    send_with_reasoning_retry(other, gateway_history(), provider="custom",
                              base_url="https://b.example/v1", model="m", memo=memo)
    assert carriers_of(other.calls[0][1]) == {RC}


# ---------------------------------------------------------------------------------------------
# Codex turn-start echo
# ---------------------------------------------------------------------------------------------


def echo(*parts: Any) -> dict[str, Any]:
    return {"type": "userMessage", "id": "item_1", "content": list(parts)}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "text_elements": []}


REASONING_ITEM = {"type": "reasoning", "id": "item_2", "summary": []}
AGENT_ITEM = {"type": "agentMessage", "id": "item_3", "text": "hello"}


def test_exact_echo_is_dropped() -> None:
    items = [echo(text_part("hi there")), REASONING_ITEM, AGENT_ITEM]
    assert suppress_turn_start_echo("hi there", items) == [REASONING_ITEM, AGENT_ITEM]


def test_plain_text_shape_is_accepted() -> None:
    items = [{"type": "userMessage", "text": "hi"}, AGENT_ITEM]
    assert suppress_turn_start_echo("hi", items) == [AGENT_ITEM]


@pytest.mark.parametrize("sent", ["hi there ", " hi there", "hi  there", "Hi there",
                                  "hi there\n", "hi"])
def test_near_miss_is_kept(sent: str) -> None:
    items = [echo(text_part("hi there")), AGENT_ITEM]
    assert suppress_turn_start_echo(sent, items) == items


def test_rich_input_is_compared_after_the_same_conversion() -> None:
    rich = [text_part("look at "), {"type": "image", "url": "https://x/y.png"},
            {"type": "localImage", "path": "/tmp/z.png"}, text_part("this")]
    assert rich_input_to_text(rich) == "look at this"
    items = [echo(*rich), AGENT_ITEM]
    assert suppress_turn_start_echo(rich_input_to_text(rich), items) == [AGENT_ITEM]
    assert suppress_turn_start_echo(rich, items) == [AGENT_ITEM]


def test_image_only_input_renders_as_empty_text() -> None:
    items = [echo({"type": "image", "url": "https://x/y.png"}), AGENT_ITEM]
    assert rich_input_to_text([{"type": "image", "url": "u"}]) == ""
    assert suppress_turn_start_echo("", items) == [AGENT_ITEM]
    assert suppress_turn_start_echo("caption", items) == items


def test_rich_input_to_text_shapes() -> None:
    assert rich_input_to_text("plain") == "plain"
    assert rich_input_to_text(None) == ""
    assert rich_input_to_text(["a", {"type": "input_text", "text": "b"}, {"text": "c"}]) == "ab"


def test_repeated_identical_turns_lose_only_the_first_echo() -> None:
    first, second = echo(text_part("again")), dict(echo(text_part("again")), id="item_9")
    items = [first, AGENT_ITEM, second, {"type": "userMessage", "text": "again"}]
    assert suppress_turn_start_echo("again", items) == items[1:]


def test_only_the_first_user_message_is_a_candidate() -> None:
    later_match = echo(text_part("sent"))
    items = [echo(text_part("steer: other")), AGENT_ITEM, later_match]
    assert suppress_turn_start_echo("sent", items) == items


def test_items_without_a_user_message_are_all_kept() -> None:
    items = [REASONING_ITEM, AGENT_ITEM, {"type": "commandExecution", "id": "c"}]
    assert suppress_turn_start_echo("anything", items) == items
    assert suppress_turn_start_echo("anything", []) == []


def test_platform_ids_are_not_consulted() -> None:
    keyed = dict(echo(text_part("x")), platform_message_id="tg:1", clientId="abc")
    assert suppress_turn_start_echo("x", [keyed, AGENT_ITEM]) == [AGENT_ITEM]
    keyless = {"type": "userMessage", "content": [text_part("x")]}
    assert suppress_turn_start_echo("x", [keyless, AGENT_ITEM]) == [AGENT_ITEM]


@given(st.text(max_size=20), st.lists(
    st.one_of(
        st.builds(lambda t: {"type": "userMessage", "text": t}, st.text(max_size=20)),
        st.builds(lambda ts: echo(*map(text_part, ts)), st.lists(st.text(max_size=8),
                                                                 max_size=3)),
        st.just(AGENT_ITEM), st.just(REASONING_ITEM),
    ),
    max_size=6,
))
def test_echo_suppression_removes_at_most_the_first_user_message(
    sent: str, items: list[dict[str, Any]]
) -> None:
    before = copy.deepcopy(items)
    kept = suppress_turn_start_echo(sent, items)
    assert items == before
    users = [i for i, item in enumerate(items) if item["type"] == "userMessage"]
    first = items[users[0]] if users else None
    first_text = (rich_input_to_text(first["content"]) if first and "content" in first
                  else first["text"] if first else None)
    if first is not None and first_text == sent:
        assert kept == items[: users[0]] + items[users[0] + 1:]
    else:
        assert kept == items


def test_gateway_writes_nothing_when_the_agent_owns_persistence() -> None:
    assert gateway_should_persist(agent_owns_persistence=True) is False
    assert gateway_should_persist(agent_owns_persistence=False) is True
